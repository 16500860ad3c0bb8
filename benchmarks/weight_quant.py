"""int8 weights (`--quantization int8`, weight-only and W8A8) against the fp32 path.

    python benchmarks/weight_quant.py                 # SmolLM2 (~5 min on 2 cores)
    python benchmarks/weight_quant.py --quick         # smoke test

Measures, for fp32 ("auto"), int8 weight-only and W8A8 (`--int8-activations`), on the same
weights:
  * perplexity of held-out prose (pydoc_data.topics), teacher-forced through the engine
    (benchmarks/kv_quant.py's method), and the mean |logprob difference| to fp32;
  * greedy closeness by vLLM's rule (`check_logprobs_close`): up to the first differing
    position the tokens are equal, and there each side's token is in the other's top-5;
  * the linear layers alone (SmolLM2's qkv / o / gate_up / down shapes x 30 layers) at
    M = 1, 64 and 512 rows: the tokens/s ceiling each kernel gives a decode step of M sequences.
Writes benchmarks/results/weight_quant.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.kv_quant import perplexity, prose_tokens, run_lockstep  # noqa: E402
from pagedllm import SamplingParams  # noqa: E402
from pagedllm.engine.llm_engine import LLMEngine  # noqa: E402
from pagedllm.kernels import cpu_ops  # noqa: E402
from pagedllm.model.layers.quant.int8 import Int8Weight  # noqa: E402

logger = logging.getLogger("benchmarks.weight_quant")
VARIANTS = {"auto": {}, "int8": {"quantization": "int8"},
            "w8a8": {"quantization": "int8", "int8_activations": True}}
SMOLLM2_LINEARS = ((576, 960), (576, 576), (576, 3072), (1536, 576))  # (K, N), 30 layers


def vllm_rule(engines: dict[str, LLMEngine], prompts: list[list[int]], gen_len: int) -> dict:
    """Greedy outputs vs fp32's, judged as vLLM's check_logprobs_close (top-5 both ways)."""
    params = SamplingParams(temperature=0.0, max_tokens=gen_len, ignore_eos=True, logprobs=5)
    for eng in engines.values():
        for i, p in enumerate(prompts):
            eng.add_request(p, params, request_id=f"g{i}")
    res = run_lockstep(engines)
    outs = {n: [res[n]["outputs"][f"g{i}"].outputs[0] for i in range(len(prompts))]
            for n in engines}
    out = {}
    for name in engines:
        prefix, ok, identical = [], 0, 0
        for ref, got in zip(outs["auto"], outs[name], strict=True):
            first = next((i for i, (a, b) in enumerate(zip(ref.token_ids, got.token_ids,
                                                           strict=True)) if a != b), None)
            if first is None:
                identical += 1
                ok += 1
                prefix.append(gen_len)
                continue
            prefix.append(first)
            a, b = ref.token_ids[first], got.token_ids[first]
            ok += int(b in ref.logprobs[first] and a in got.logprobs[first])
        out[name] = {"sequences": len(prompts), "identical": identical, "close_by_vllm_rule": ok,
                     "mean_tokens_before_first_difference": statistics.fmean(prefix)}
    return out


def linear_ceiling(ms: list[int], reps: int) -> dict:
    """Seconds of SmolLM2's 30 x 4 linear layers per kernel at M rows -> tokens/s ceiling."""
    ops = cpu_ops.load()
    out: dict = {}
    for m in ms:
        row = {}
        for name in VARIANTS:
            layers = []
            for k, n in SMOLLM2_LINEARS:
                w = torch.randn(n, k) * 0.05
                if name == "auto":
                    packed = ops.pack_linear_weight(w)
                    layers.append((k, lambda x, p=packed, n=n: ops.packed_linear(x, p, n, None)))
                else:
                    q = Int8Weight.quantize(w, w8a8=name == "w8a8")
                    layers.append((k, q.linear))
            xs = {k: torch.randn(m, k) for k, _ in SMOLLM2_LINEARS}
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                for k, fn in layers:
                    fn(xs[k])
                times.append((time.perf_counter() - t0) * 30)
            row[name] = {"seconds_30_layers": min(times), "tok_s": m / min(times)}
        out[str(m)] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--segments", type=int, default=8)
    ap.add_argument("--segment-len", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--gen-len", type=int, default=64)
    ap.add_argument("--linear-ms", default="1,64,512")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/weight_quant.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.quick:
        args.segments, args.segment_len, args.prompts, args.gen_len = 2, 32, 2, 8
        args.linear_ms, args.reps = "1,8", 2
    torch.set_num_threads(args.threads)
    res: dict = {"args": vars(args), "cpu_flags": sorted(cpu_flags())}
    res["linears"] = linear_ceiling([int(m) for m in args.linear_ms.split(",")], args.reps)
    engines = {name: LLMEngine.from_engine_args(
        model=args.model, num_threads=args.threads, kv_cache_memory="512MiB",
        max_num_seqs=max(args.segments, args.prompts), enable_prefix_caching=False, **extra)
        for name, extra in VARIANTS.items()}
    res["weight_bytes"] = {name: sum(getattr(m, "weight_nbytes", 0)
                                     for m in e.runner.model.modules())
                           for name, e in engines.items()}
    text = prose_tokens(engines["auto"].tokenizer)
    half = len(text) // 2
    stride = (half - args.segment_len) // max(args.segments - 1, 1)
    segments = [text[i * stride:i * stride + args.segment_len] for i in range(args.segments)]
    pstride = (half - 64) // max(args.prompts, 1)
    prompts = [text[half + i * pstride:half + i * pstride + 64] for i in range(args.prompts)]
    res["perplexity"] = perplexity(engines, segments)
    res["greedy"] = vllm_rule(engines, prompts, args.gen_len)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print("\n| kernel | " + " | ".join(f"M={m} tok/s" for m in res["linears"]) + " |")
    print("|---|" + "---:|" * len(res["linears"]))
    for name in VARIANTS:
        print(f"| {name} | " + " | ".join(f"{r[name]['tok_s']:.0f}"
                                         for r in res["linears"].values()) + " |")
    print("\n| weights | linear bytes (MB) | perplexity | mean abs logprob diff vs fp32 | "
          "greedy identical / close (vLLM rule) / sequences |")
    print("|---|---:|---:|---:|---|")
    for name in VARIANTS:
        p, g = res["perplexity"][name], res["greedy"][name]
        print(f"| {name} | {res['weight_bytes'][name] / 1e6:.1f} | {p['ppl']:.3f} | "
              f"{p['mean_abs_logprob_diff_vs_auto']:.4f} | {g['identical']} / "
              f"{g['close_by_vllm_rule']} / {g['sequences']} |")
    print(f"\nwrote {out}")
    return 0


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return {f for f in text.split() if f.startswith("avx512") or f in ("avx2", "fma", "f16c")}


if __name__ == "__main__":
    sys.exit(main())
