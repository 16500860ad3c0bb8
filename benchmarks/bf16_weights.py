"""bf16 linear weights under fp32 compute (`--dtype bfloat16` on CPU) against fp32, through
the `LLM` API, both engines in one process, measurements interleaved.

    python benchmarks/bf16_weights.py                 # SmolLM2 dequantized (~3 min, 2 cores)
    python benchmarks/bf16_weights.py --quick         # smoke test
    python benchmarks/bf16_weights.py --model DIR --modes float32,bfloat16,int8 --offline 16

For each mode (float32 / bfloat16: `--dtype`, on the same dequantized weights,
`--quantization none`; int8: `--quantization int8`, fp32 activations or int8 ones where the
CPU picks them):
  * one-stream decode tokens/s: (time of a 1 + N token generation - time of a 1-token one) / N;
  * prefill tokens/s of a 512-token prompt (one request, max_tokens=1, no prefix cache);
  * greedy closeness of bf16 to fp32 by vLLM's rule (4 prompts x 32 tokens, top-5);
  * weight bytes held;
  * with --offline N: N requests x 128 in / 128 out in one `generate`, output tokens/s.
Best of `--reps` rounds; each round runs every dtype once (interleaved, so load from other
processes hits both alike). Writes benchmarks/results/bf16_weights.json, prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pagedllm import LLM, SamplingParams  # noqa: E402
from pagedllm.worker.model_setup import weight_bytes  # noqa: E402

MODES = {"float32": dict(dtype="float32", quantization="none"),
         "bfloat16": dict(dtype="bfloat16", quantization="none"),
         "int8": dict(dtype="float32", quantization="int8")}
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at a temperature of",
           "Once upon a time, in a small village,"]


def offline_batch(n: int) -> list[dict]:
    """n distinct 128-token prompts (token ids) for the offline runs of the benchmarks."""
    return [{"prompt_token_ids": [(7 * i + j) % 1000 + 100 for j in range(128)]}
            for i in range(n)]


def timed(llm: LLM, prompt: list[int], max_tokens: int) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    return time.perf_counter() - t0


def close_by_vllm_rule(ref: list, got: list) -> tuple[int, int]:
    """(sequences close by vLLM's rule, identical leading tokens in all)."""
    ok = same = 0
    for a, b in zip(ref, got, strict=True):
        first = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=True))
                      if x != y), None)
        if first is None:
            ok, same = ok + 1, same + len(a.token_ids)
            continue
        same += first
        ok += int(b.token_ids[first] in a.logprobs[first]
                  and a.token_ids[first] in b.logprobs[first])
    return ok, same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct GGUF")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--modes", default="float32,bfloat16",
                        help=f"comma-separated, of {', '.join(MODES)} (the first is the reference)")
    parser.add_argument("--offline", type=int, default=0,
                        help="N requests of 128 in / 128 out in one call (0: skip)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.decode_tokens, args.prefill, args.reps = 8, 64, 1
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    llms = {d: LLM(args.model, **MODES[d], num_threads=args.threads,
                   max_model_len=max(args.prefill + args.decode_tokens + 8, 264),
                   kv_cache_memory=256 * 2**20 + args.offline * 2**20 * 8,
                   enable_prefix_caching=False) for d in modes}
    tok = llms[modes[0]].get_tokenizer()
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * (args.prefill // 8))
    long_prompt = tok.encode(text)[:args.prefill]
    short = tok.encode(PROMPTS[0])
    best: dict[str, dict[str, float]] = {d: {"decode": 0.0, "prefill": 0.0, "offline": 0.0}
                                         for d in modes}
    batch = offline_batch(args.offline)
    offline_params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    for llm in llms.values():  # warm-up: kernels, allocator, thread team
        timed(llm, short, 4)
        timed(llm, long_prompt, 1)
    for _ in range(args.reps):
        for name, llm in llms.items():
            one = timed(llm, short, 1)
            many = timed(llm, short, 1 + args.decode_tokens)
            best[name]["decode"] = max(best[name]["decode"], args.decode_tokens / (many - one))
            best[name]["prefill"] = max(best[name]["prefill"],
                                        len(long_prompt) / timed(llm, long_prompt, 1))
            if batch:
                t0 = time.perf_counter()
                llm.generate(batch, offline_params, use_tqdm=False)
                best[name]["offline"] = max(best[name]["offline"],
                                            128 * len(batch) / (time.perf_counter() - t0))
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=5)
    outs = {d: [o.outputs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]
            for d, llm in llms.items()}
    closeness = {}
    for d in modes[1:]:
        ok, same = close_by_vllm_rule(outs[modes[0]], outs[d])
        closeness[f"{d}_vs_{modes[0]}"] = {"close_by_vllm_rule": f"{ok}/{len(PROMPTS)}",
                                           "identical_leading_tokens": f"{same}/{32 * len(PROMPTS)}"}
    result = {
        "load_average": os.getloadavg(), "threads": args.threads,
        "decode_tokens": args.decode_tokens, "prefill_tokens": len(long_prompt),
        "offline_requests": args.offline,
        "dtypes": {d: {**best[d], "weight_mib": weight_bytes(llms[d].llm_engine.model) / 2**20}
                   for d in modes},
        **closeness,
    }
    print(f"| mode | decode tok/s (1 stream) | prefill-{len(long_prompt)} tok/s | "
          f"offline {args.offline} x 128/128 tok/s | weights MiB |")
    print("|---|---|---|---|---|")
    for d in modes:
        r = result["dtypes"][d]
        print(f"| {d} | {r['decode']:.1f} | {r['prefill']:.0f} | {r['offline']:.0f} | "
              f"{r['weight_mib']:.0f} |")
    for name, c in closeness.items():
        print(f"{name} by vLLM's rule: {c['close_by_vllm_rule']} close, "
              f"{c['identical_leading_tokens']} identical leading tokens")
    print(f"load average {result['load_average']}")
    out = args.out or ROOT / "benchmarks" / "results" / (
        "bf16_weights_quick.json" if args.quick else "bf16_weights.json")
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
