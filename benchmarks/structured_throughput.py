"""Throughput with JSON-schema-constrained rows: 0%, 50% and 100% of 32 concurrent sequences,
same run (SmolLM2-135M by default).

    python benchmarks/structured_throughput.py            # 32 x (32 in / 32 out)
    python benchmarks/structured_throughput.py --quick    # 8 x (16 / 8), smoke test

One engine per fraction, all loaded at once and stepped in lockstep (one `step()` of each in
turn, each timed alone), so that a shared machine's load falls on all of them alike. Every
request is greedy and generates exactly `--output-len` tokens: free rows with ignore_eos,
constrained rows under a schema that cannot close that early (an array of at least 100 person
objects, benchmarks/json_schemas.py), so each batch stays 32 wide and the difference is the
cost of constraining alone (mask fill, mask application, matcher advance). Reported: output
tokens per second of each engine's own step time, its ratio to 0%, and the median sampler time
per step (which includes the masks). Writes benchmarks/results/structured_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import time
from pathlib import Path

from json_schemas import LONG_ARRAY
from throughput import make_prompts

from pagedllm import LLM, SamplingParams, StructuredOutputsParams


def add_requests(llm: LLM, prompts, fraction: float, output_len: int) -> None:
    so = StructuredOutputsParams(json=LONG_ARRAY)
    n_constrained = round(len(prompts) * fraction)
    for i, p in enumerate(prompts):
        # 50%: every other row, so constrained and free rows interleave in the batch
        constrained = i % 2 == 1 if fraction == 0.5 else i < n_constrained
        llm.llm_engine.add_request(p, SamplingParams(
            temperature=0, max_tokens=output_len, ignore_eos=True,
            structured_outputs=so if constrained else None))


def run_lockstep(llms: dict[float, LLM], prompts, output_len: int) -> dict[float, dict]:
    for f, llm in llms.items():
        add_requests(llm, prompts, f, output_len)
    busy = {f: 0.0 for f in llms}
    tokens = {f: 0 for f in llms}
    sample_ms: dict[float, list[float]] = {f: [] for f in llms}
    while any(llm.llm_engine.has_unfinished_requests() for llm in llms.values()):
        for f, llm in llms.items():
            eng = llm.llm_engine
            if not eng.has_unfinished_requests():
                continue
            t0 = time.perf_counter()
            outs = eng.step()
            busy[f] += time.perf_counter() - t0
            sample_ms[f].append(eng.stats.last.timings_ms.get("sample", 0.0))
            for out in outs:
                if out.finished:
                    c = out.outputs[0]
                    tokens[f] += len(c.token_ids)
                    if f == 1.0 and not c.text.startswith("[{"):
                        raise AssertionError(f"a constrained row ignored its schema: {c.text!r}")
    return {f: {"constrained_fraction": f, "requests": len(prompts), "seconds": busy[f],
                "output_tokens": tokens[f], "output_tok_s": tokens[f] / busy[f],
                "sample_ms_median": statistics.median(sample_ms[f])} for f in llms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/structured_throughput.json")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.input_len, args.output_len = 8, 16, 8
    fractions = [0.0, 0.5, 1.0]
    llms = {f: LLM(args.model, max_num_seqs=args.requests, kv_cache_memory=256 * 2**20,
                   max_model_len=512) for f in fractions}
    prompts = make_prompts(llms[0.0].get_tokenizer(), args.requests, args.input_len)
    for llm in llms.values():  # warm-up: kernels, llguidance tokenizer, schema compile
        add_requests(llm, prompts[:2], 1.0, 2)
        while llm.llm_engine.has_unfinished_requests():
            llm.llm_engine.step()
    results = run_lockstep(llms, prompts, args.output_len)
    base = results[0.0]["output_tok_s"]
    rows = []
    print("\n| constrained rows | output tok/s | vs 0% | sampler ms/step (median) |")
    print("|---|---|---|---|")
    for f in fractions:
        r = results[f]
        rows.append({**r, "ratio_vs_unconstrained": r["output_tok_s"] / base})
        print(f"| {int(f * 100)}% | {r['output_tok_s']:.1f} | {r['output_tok_s'] / base:.3f}x "
              f"| {r['sample_ms_median']:.1f} |")
    flags = sorted(set(re.findall(r"avx512[a-z_]*|avx2", Path("/proc/cpuinfo").read_text())))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "cpu": platform.processor() or platform.machine(), "cpu_flags": flags,
        "args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
