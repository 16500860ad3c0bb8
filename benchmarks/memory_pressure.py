"""Throughput under KV memory pressure: recompute vs swap preemption vs an unconstrained pool.

    python benchmarks/memory_pressure.py                  # SmolLM2, 16 x (64 in + 64 out)
    python benchmarks/memory_pressure.py --quick          # tiny sizes, smoke test
    python benchmarks/memory_pressure.py --model DIR --pool-fraction 0.25

All `--num-requests` requests (random token-id prompts of `--input-len` tokens, greedy,
`--output-len` new tokens, ignore_eos) are queued at once. The working set is every
request's full sequence, num_requests x (input_len + output_len) tokens; the constrained
runs get a KV pool of `--pool-fraction` of it (rounded up to whole blocks, at least one
max_model_len sequence):

  * unconstrained: the default pool (2 GiB on CPU), no preemption;
  * recompute:     preempted requests free their blocks and prefill everything again;
  * swap:          preempted requests' blocks go to CPU swap space and come back.

Reports wall time, output tokens/s, preemptions, blocks swapped out / in and tokens
recomputed (tokens run through the model beyond each request's prompt + output), checks the
outputs of all three are identical, prints a markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import random
import time
from pathlib import Path

import torch

from pagedllm import LLM, SamplingParams

logger = logging.getLogger("benchmarks.memory_pressure")
GiB = 2**30


def make_llm(args, **engine_args) -> LLM:
    llm = LLM(args.model, num_threads=args.num_threads, max_num_seqs=args.num_requests,
              max_model_len=args.input_len + args.output_len, **engine_args)
    # Warm-up: one-time costs (first forward passes, kernel loads) stay out of the timing.
    llm.generate([[100 + i for i in range(args.input_len)]], SamplingParams(max_tokens=2),
                 use_tqdm=False)
    return llm


def run(llm: LLM, prompts: list[list[int]], output_len: int) -> dict:
    engine = llm.llm_engine
    schedule = engine.scheduler.schedule
    batched = [0]

    def counting():
        out = schedule()
        batched[0] += out.num_batched_tokens
        return out

    engine.scheduler.schedule = counting
    st = engine.stats
    before = (st.num_preemptions_total, st.swapped_out_blocks_total, st.swapped_in_blocks_total,
              st.num_steps)
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    engine.scheduler.schedule = schedule
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    # The last sampled token of each request is never run through the model.
    needed = sum(map(len, prompts)) + generated - len(prompts)
    return {"seconds": dt, "output_tokens": generated, "output_tok_s": generated / dt,
            "num_blocks": engine.num_blocks, "block_size": engine.block_manager.block_size,
            "steps": st.num_steps - before[3],
            "preemptions": st.num_preemptions_total - before[0],
            "swapped_out_blocks": st.swapped_out_blocks_total - before[1],
            "swapped_in_blocks": st.swapped_in_blocks_total - before[2],
            "swap_outs": engine.scheduler.num_swap_outs,
            "recomputed_tokens": batched[0] - needed,
            "token_ids": [o.outputs[0].token_ids for o in outs]}


def print_table(res: dict) -> None:
    base = res["runs"]["unconstrained"]
    print(f"\n{res['args']['num_requests']} requests x ({res['args']['input_len']} in + "
          f"{res['args']['output_len']} out); working set {res['working_set_tokens']} tokens, "
          f"constrained pool {res['pool_tokens']} tokens "
          f"({100 * res['pool_tokens'] / res['working_set_tokens']:.0f}%)\n")
    print("| run | KV pool (tokens) | wall (s) | output tok/s | vs unconstrained | steps | "
          "preemptions | swapped out / in (blocks) | recomputed tokens | same output |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---|")
    for name, r in res["runs"].items():
        same = "yes" if r["token_ids"] == base["token_ids"] else "NO"
        print(f"| {name} | {r['num_blocks'] * r['block_size']} | {r['seconds']:.1f} | "
              f"{r['output_tok_s']:.1f} | {r['output_tok_s'] / base['output_tok_s']:.2f}x | "
              f"{r['steps']} | {r['preemptions']} | {r['swapped_out_blocks']} / "
              f"{r['swapped_in_blocks']} | {r['recomputed_tokens']} | {same} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--pool-fraction", type=float, default=0.25,
                    help="constrained KV pool as a fraction of the working set")
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    ap.add_argument("--out", default="benchmarks/results/memory_pressure.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.quick:
        args.num_requests, args.input_len, args.output_len = 6, 16, 16
    rng = random.Random(0)
    runs: dict[str, dict] = {}
    llm = make_llm(args)
    spec = llm.llm_engine.kv_spec
    prompts = [[rng.randrange(100, llm.llm_engine.vocab_size) for _ in range(args.input_len)]
               for _ in range(args.num_requests)]
    working_set = args.num_requests * (args.input_len + args.output_len)
    blocks = max(-(-int(args.pool_fraction * working_set) // spec.block_size),
                 spec.blocks_per_seq(args.input_len + args.output_len))
    logger.info("unconstrained")
    runs["unconstrained"] = run(llm, prompts, args.output_len)
    del llm
    gc.collect()
    swap_gib = 2 * working_set * spec.bytes_per_token / GiB  # room for everything
    for mode in ("recompute", "swap"):
        logger.info("%s, %d blocks", mode, blocks)
        llm = make_llm(args, kv_cache_memory=blocks * spec.bytes_per_block,
                       preemption_mode=mode, swap_space=swap_gib)
        runs[mode] = run(llm, prompts, args.output_len)
        del llm
        gc.collect()
    res = {"machine": {"platform": platform.platform(), "cpu": platform.processor(),
                       "threads": args.num_threads or torch.get_num_threads(),
                       "torch": torch.__version__},
           "args": vars(args), "working_set_tokens": working_set,
           "pool_tokens": blocks * spec.block_size, "bytes_per_token": spec.bytes_per_token,
           "runs": runs}
    print_table(res)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
