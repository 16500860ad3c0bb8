"""Mixed prompt lengths in one call: does a batch cost what its tokens cost, or what its
longest prompt costs? Runs one long prompt alone, the short prompts alone, then all of them
in one `generate` call (greedy, ignore_eos), alternating rounds, and prints the ratio of the
mixed call to the sum of its parts (1.0 = no padding cost; the attention over packed
sequences, kernels/varlen_attention_cpu.cpp, is what keeps it there).

    python benchmarks/mixed_lengths.py                      # 900 + 19 x 5 tokens, 16 out
    python benchmarks/mixed_lengths.py --long 2000 --short 31 --output-len 1
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import time
from pathlib import Path

import torch

from pagedllm import LLM, SamplingParams
from pagedllm.kernels.cpu_features import cpu_flags

logger = logging.getLogger("benchmarks.mixed_lengths")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--long", type=int, default=900, help="tokens of the long prompt")
    ap.add_argument("--short", type=int, default=19, help="number of short prompts")
    ap.add_argument("--short-len", type=int, default=5, help="tokens of each short prompt")
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engine-args", default="{}", help="JSON dict of extra LLM(...) arguments")
    ap.add_argument("--out", default="benchmarks/results/mixed_lengths.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # No prefix caching: every round re-runs the same prompts, which would otherwise be hits.
    llm = LLM(args.model, max_num_seqs=max(args.short + 1, 8),
              max_num_batched_tokens=max(2048, args.long + args.short * args.short_len),
              enable_prefix_caching=False, **json.loads(args.engine_args))
    vocab = llm.llm_engine.vocab_size
    gen = torch.Generator().manual_seed(0)

    def prompt(n: int) -> dict:
        return {"prompt_token_ids": torch.randint(100, vocab, (n,), generator=gen).tolist()}

    long = [prompt(args.long)]
    short = [prompt(args.short_len) for _ in range(args.short)]
    sp = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    runs = {"long": long, "short": short, "mixed": long + short}

    def timed(batch: list[dict]) -> float:
        t0 = time.perf_counter()
        llm.generate(batch, sp, use_tqdm=False)
        return time.perf_counter() - t0

    timed(runs["mixed"])  # warm-up
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.rounds):
        for name, batch in runs.items():
            times[name].append(timed(batch))
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["mixed"] / (med["long"] + med["short"])
    res = {"machine": {"platform": platform.platform(), "cpu_flags": cpu_flags(),
                       "threads": torch.get_num_threads(), "torch": torch.__version__},
           "args": vars(args), "times_s": times, "median_s": med,
           "mixed_over_parts": ratio}
    print(f"1 x {args.long} + {args.short} x {args.short_len} prompt tokens, "
          f"{args.output_len} out, median of {args.rounds}; CPU: {' '.join(cpu_flags())}")
    print(f"{'long alone s':>13s} {'short alone s':>14s} {'mixed s':>9s} {'mixed/parts':>12s}")
    print(f"{med['long']:13.3f} {med['short']:14.3f} {med['mixed']:9.3f} {ratio:12.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
