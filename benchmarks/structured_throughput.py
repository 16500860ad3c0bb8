"""Throughput with JSON-schema-constrained rows: 0%, 50% and 100% of 32 concurrent sequences,
same run, same engine (SmolLM2-135M by default).

    python benchmarks/structured_throughput.py            # 32 x (64 in / 128 out), 2 rounds
    python benchmarks/structured_throughput.py --quick    # 8 x (16 / 16), smoke test

Every request is greedy and generates exactly `--output-len` tokens: free rows with
ignore_eos, constrained rows under a schema that cannot close that early (an array of at least
100 person objects, benchmarks/json_schemas.py), so the batch stays 32 wide throughout and the
difference is the cost of constraining alone (mask fill, mask application, matcher advance).
Rounds alternate the order (0/50/100, then 100/50/0) so that a shared machine's load falls on
all of them alike; reported: output tok/s (mean of the rounds) and its ratio to 0%, and the
engine's per-step sampler time (which includes the masks). Writes
benchmarks/results/structured_throughput.json.
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


def run(llm: LLM, prompts, fraction: float, output_len: int) -> dict:
    eng = llm.llm_engine
    n_constrained = round(len(prompts) * fraction)
    so = StructuredOutputsParams(json=LONG_ARRAY)
    for i, p in enumerate(prompts):
        constrained = i % 2 == 1 if fraction == 0.5 else i < n_constrained
        sp = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True,
                            structured_outputs=so if constrained else None)
        eng.add_request(p, sp)
    sample_ms, steps, tokens = [], 0, 0
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                tokens += len(out.outputs[0].token_ids)
                if fraction == 1.0 and not out.outputs[0].text.startswith("[{"):
                    raise AssertionError("a constrained row did not follow its schema")
        steps += 1
        sample_ms.append(eng.stats.last.timings_ms.get("sample", 0.0))
    dt = time.perf_counter() - t0
    return {"constrained_fraction": fraction, "requests": len(prompts), "seconds": dt,
            "output_tokens": tokens, "output_tok_s": tokens / dt, "steps": steps,
            "sample_ms_median": statistics.median(sample_ms)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/structured_throughput.json")
    args = ap.parse_args()
    if args.quick:
        args.requests, args.input_len, args.output_len, args.rounds = 8, 16, 16, 1
    llm = LLM(args.model, max_num_seqs=args.requests)
    prompts = make_prompts(llm.get_tokenizer(), args.requests, args.input_len)
    run(llm, prompts[:4], 0.5, 4)  # warm-up (kernels, grammar compile, llguidance tokenizer)
    fractions = [0.0, 0.5, 1.0]
    results: dict[float, list[dict]] = {f: [] for f in fractions}
    for r in range(args.rounds):
        for f in fractions if r % 2 == 0 else fractions[::-1]:
            res = run(llm, prompts, f, args.output_len)
            results[f].append(res)
            print(json.dumps(res))
    base = statistics.mean(x["output_tok_s"] for x in results[0.0])
    rows = []
    print("\n| constrained rows | output tok/s (per round) | mean | vs 0% | sampler ms/step |")
    print("|---|---|---|---|---|")
    for f in fractions:
        rates = [x["output_tok_s"] for x in results[f]]
        mean = statistics.mean(rates)
        sample = statistics.mean(x["sample_ms_median"] for x in results[f])
        rows.append({"constrained_fraction": f, "output_tok_s": rates, "mean": mean,
                     "ratio_vs_unconstrained": mean / base, "sample_ms_median": sample})
        print(f"| {int(f * 100)}% | {' / '.join(f'{x:.1f}' for x in rates)} | {mean:.1f} | "
              f"{mean / base:.3f}x | {sample:.1f} |")
    flags = sorted(set(re.findall(r"avx512[a-z_]*|avx2", Path("/proc/cpuinfo").read_text())))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({
        "cpu": platform.processor() or platform.machine(), "cpu_flags": flags,
        "args": vars(args), "rows": rows, "runs": {str(k): v for k, v in results.items()}},
        indent=1))


if __name__ == "__main__":
    main()
