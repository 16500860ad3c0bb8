"""What a decode step costs beyond reading the weights, before and after issue 27's session-23
changes, in one run: pagedllm with default flags against `--num-scheduler-steps 1` (one
decode step per engine step) and against that with the weights left where they were loaded
(PAGEDLLM_WEIGHT_ARENA=0: the engine before both changes).

    python benchmarks/decode_steps.py [--model file.gguf] [--threads 2] [--offline 4,64]

Each variant is its own `LLM` in this process (the arena is chosen when the weights load);
rounds alternate between them, best of `--rounds`. Numbers (benchmarks/int8_tiles.py's
engine_round): one-stream decode tok/s (64 tokens after a 6-token prompt), a 512-token
prefill tok/s, N requests x 128 / 128 output tok/s (prefill included) for each N of
--offline, and one stream and the first N again with random sampling (temperature 1, top-p
0.95, seeded: the OpenAI API's default temperature; "sampled"). Prints a table with each variant's ratio to default flags and whether every
variant gave the same greedy tokens; writes JSON (`--out`).
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

from benchmarks.int8_tiles import engine_round  # noqa: E402
from pagedllm.kernels import cpu_features  # noqa: E402

VARIANTS = {  # name -> (PAGEDLLM_WEIGHT_ARENA, num_scheduler_steps)
    "default flags": ("1", 8),
    "--num-scheduler-steps 1": ("1", 1),
    "steps 1, weights as loaded": ("0", 1),
}


def open_variant(model: str | None, threads: int, arena: str, steps: int, offline: int):
    from pagedllm import LLM

    os.environ["PAGEDLLM_WEIGHT_ARENA"] = arena
    try:
        return LLM(model, num_threads=threads, max_model_len=1024, enable_prefix_caching=False,
                   kv_cache_memory=256 * 2**20 + offline * 2**20 * 8, num_scheduler_steps=steps)
    finally:
        os.environ.pop("PAGEDLLM_WEIGHT_ARENA")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct (Q4_1 GGUF)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--offline", default="4,64", help="request counts of the offline runs")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path,
                    default=ROOT / "benchmarks" / "results" / "decode_steps.json")
    args = ap.parse_args()
    levels = [int(n) for n in args.offline.split(",") if n]
    llms = {name: open_variant(args.model, args.threads, arena, steps, max(levels, default=0))
            for name, (arena, steps) in VARIANTS.items()}
    for llm in llms.values():
        engine_round(llm, 0)  # warm-up
    best: dict[str, dict[str, float]] = {name: {} for name in llms}
    tokens: dict[str, list] = {}
    for _ in range(args.rounds):
        for name, llm in llms.items():
            numbers, tokens[name] = variant_round(llm, levels)
            for key, value in numbers.items():
                best[name][key] = max(best[name].get(key, 0.0), value)
    first = next(iter(tokens.values()))
    keys = ["decode_1", "prefill_512", *(f"offline_{n}" for n in levels), "decode_1_sampled",
            *(f"offline_{n}_sampled" for n in levels[:1])]
    base = best["default flags"]
    result = {"cpu_flags": " ".join(cpu_features.cpu_flags()), "threads": args.threads,
              "model": args.model or "SmolLM2-135M-Instruct Q4_1", "rounds": args.rounds,
              "load_average": os.getloadavg(),
              "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "variants": best, "greedy_tokens_equal": all(t == first for t in tokens.values())}
    print(f"| variant (best of {args.rounds}) | one stream tok/s | prefill 512 tok/s | "
          + " | ".join(f"offline {n} x 128/128" for n in levels) + " | one stream, sampled | "
          + " | ".join(f"offline {n}, sampled" for n in levels[:1]) + " |")
    print("|---|" + "---:|" * len(keys))
    for name, numbers in best.items():
        cells = [f"{numbers[k]:.0f}" + ("" if name == "default flags"
                                        else f" ({numbers[k] / base[k]:.2f}x)") for k in keys]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"greedy tokens equal across variants: {result['greedy_tokens_equal']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def variant_round(llm, levels: list[int]) -> tuple[dict[str, float], list]:
    """engine_round's numbers with the first offline level, then the other levels' offline
    output tok/s (`offline_N`), then sampled rows: one stream (128 tokens after the short
    prompt, prefill included) and the first level; the first level's greedy tokens."""
    from benchmarks.bf16_weights import offline_batch
    from benchmarks.int8_tiles import SHORT_PROMPT
    from pagedllm import SamplingParams

    def output_rate(prompts, params) -> float:
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return params.max_tokens * len(prompts) / (time.perf_counter() - t0)

    numbers, tokens = engine_round(llm, levels[0] if levels else 0)
    if levels:
        numbers[f"offline_{levels[0]}"] = numbers.pop("offline")
    greedy = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    for n in levels[1:]:
        numbers[f"offline_{n}"] = output_rate(offline_batch(n), greedy)
    random = SamplingParams(temperature=1.0, top_p=0.95, seed=0, max_tokens=128, ignore_eos=True)
    numbers["decode_1_sampled"] = output_rate([{"prompt_token_ids": SHORT_PROMPT}], random)
    for n in levels[:1]:
        numbers[f"offline_{n}_sampled"] = output_rate(offline_batch(n), random)
    return numbers, tokens


if __name__ == "__main__":
    main()
