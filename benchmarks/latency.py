"""End-to-end latency of one batch (like `vllm bench latency`): --batch-size requests of
--input-len prompt tokens and --output-len generated tokens (greedy, ignore_eos), run
--num-iters times after --num-iters-warmup; prints mean / median / p90 / p99 seconds.

    python benchmarks/latency.py --batch-size 8 --input-len 32 --output-len 128
    pagedllm bench latency --batch-size 1 --output-len 64
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

logger = logging.getLogger("benchmarks.latency")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--num-iters-warmup", type=int, default=1)
    ap.add_argument("--num-iters", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/latency.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    llm = LLM(args.model, max_num_seqs=max(args.batch_size, 1))
    vocab = llm.llm_engine.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, vocab, (args.input_len,), generator=gen).tolist()
               for _ in range(args.batch_size)]
    sp = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    for _ in range(args.num_iters_warmup):
        llm.generate(prompts, sp, use_tqdm=False)
    latencies = []
    for _ in range(args.num_iters):
        t0 = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        latencies.append(time.perf_counter() - t0)
    res = {"machine": {"platform": platform.platform(), "threads": torch.get_num_threads(),
                       "torch": torch.__version__},
           "args": vars(args), "latencies_s": latencies,
           "mean_s": statistics.mean(latencies), "median_s": statistics.median(latencies),
           "p90_s": percentile(latencies, 90), "p99_s": percentile(latencies, 99)}
    print(f"batch {args.batch_size} x ({args.input_len} in, {args.output_len} out), "
          f"{args.num_iters} iterations")
    print(f"{'mean s':>10s} {'median s':>10s} {'p90 s':>10s} {'p99 s':>10s}")
    print(f"{res['mean_s']:10.3f} {res['median_s']:10.3f} {res['p90_s']:10.3f} "
          f"{res['p99_s']:10.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
