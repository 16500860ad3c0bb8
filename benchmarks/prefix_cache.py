"""Prefix caching: requests sharing a long system prompt, with and without the cache, one run.

    python benchmarks/prefix_cache.py                        # 100 requests, SmolLM2 default
    python benchmarks/prefix_cache.py --uncached-requests 5  # fewer full prefills without cache
    python benchmarks/prefix_cache.py --quick                # tiny sizes, smoke test

Every prompt = one `--system-len`-token system prompt + its own `--suffix-len`-token user
suffix (token ids cut from the stdlib's pydoc prose). Two workloads per configuration, each on
a fresh engine (empty cache) after an unrelated warm-up request of the same length:

  * sequential: requests one after another (max_tokens=1), TTFT of each = first token time -
    arrival. Cold = the first request (empty cache) and every request with caching off;
    warm = the later requests with caching on, which find the system prompt cached.
  * burst: all requests queued at once (max_tokens=`--output-len`), peak KV blocks in use
    (held by a block table; cached blocks nobody holds are free) over the run, and wall time.

Without caching every request prefills all its tokens, which takes minutes on a small CPU,
so that configuration runs `--uncached-requests` requests (the caching-on burst also runs at
that size, to compare peaks like for like). Prints a markdown table and writes JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import statistics
import time
from pathlib import Path

import torch

from pagedllm import LLM, SamplingParams

logger = logging.getLogger("benchmarks.prefix_cache")


def make_prompts(tokenizer, n: int, system_len: int, suffix_len: int) -> list[list[int]]:
    from pydoc_data.topics import topics

    ids = tokenizer.encode(" ".join(topics.values()))
    need = system_len + n * suffix_len
    if len(ids) < need:
        raise ValueError(f"need {need} tokens of text, the pydoc prose has {len(ids)}")
    system = ids[:system_len]
    return [system + ids[system_len + i * suffix_len:system_len + (i + 1) * suffix_len]
            for i in range(n)]


def make_llm(args, caching: bool) -> LLM:
    llm = LLM(args.model, enable_prefix_caching=caching, num_threads=args.num_threads,
              max_model_len=args.system_len + args.suffix_len + args.output_len + 16)
    # Warm-up on an unrelated prompt of the same length: one-time costs (first forward
    # passes at these shapes) stay out of the first measurement.
    warmup = [100 + i % 64 for i in range(args.system_len + args.suffix_len)]
    llm.generate([warmup], SamplingParams(max_tokens=2), use_tqdm=False)
    return llm


def sequential(llm: LLM, prompts: list[list[int]]) -> dict:
    params = SamplingParams(temperature=0, max_tokens=1)
    st = llm.llm_engine.stats
    queries0, hits0 = st.prefix_cache_queries, st.prefix_cache_hits   # the warm-up's
    ttft, cached = [], []
    for p in prompts:
        (out,) = llm.generate({"prompt_token_ids": p}, params, use_tqdm=False)
        ttft.append(out.metrics.time_to_first_token)
        cached.append(out.num_cached_tokens)
    return {"requests": len(prompts), "ttft_s": ttft, "num_cached_tokens": cached,
            "prefix_cache_queries": st.prefix_cache_queries - queries0,
            "prefix_cache_hits": st.prefix_cache_hits - hits0}


def burst(llm: LLM, prompts: list[list[int]], output_len: int) -> dict:
    engine = llm.llm_engine
    bm, schedule = engine.block_manager, engine.scheduler.schedule
    peak = 0

    def recording():
        nonlocal peak
        out = schedule()
        peak = max(peak, bm.num_blocks - bm.num_free_blocks)
        return out

    engine.scheduler.schedule = recording
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    engine.scheduler.schedule = schedule
    return {"requests": len(prompts), "peak_blocks": peak, "num_blocks": bm.num_blocks,
            "block_size": bm.block_size, "seconds": dt,
            "preemptions": engine.stats.num_preemptions_total,
            "prompt_tokens_cached": sum(o.num_cached_tokens for o in outs),
            "prompt_tokens": sum(map(len, prompts))}


def run_config(args, prompts, caching: bool, burst_sizes: list[int]) -> dict:
    res: dict = {"caching": caching}
    for name, fn in [("sequential", lambda llm: sequential(llm, prompts))] + [
            (f"burst{n}", lambda llm, n=n: burst(llm, prompts[:n], args.output_len))
            for n in burst_sizes]:
        llm = make_llm(args, caching)
        logger.info("caching %s: %s", "on" if caching else "off", name)
        res[name] = fn(llm)
        del llm
        gc.collect()
    return res


def summarize(res: dict) -> list[dict]:
    rows = []
    for cfg in (res["caching_on"], res["caching_off"]):
        seq = cfg["sequential"]
        ttft = seq["ttft_s"]
        warm = ttft[1:] if cfg["caching"] else []
        bursts = {k: v for k, v in cfg.items() if k.startswith("burst")}
        rows.append({
            "caching": "on" if cfg["caching"] else "off",
            "sequential_requests": seq["requests"],
            "ttft_cold_s": ttft[0] if cfg["caching"] else statistics.median(ttft),
            "ttft_warm_median_s": statistics.median(warm) if warm else None,
            "ttft_warm_p90_s": sorted(warm)[int(0.9 * (len(warm) - 1))] if warm else None,
            "hit_rate": seq["prefix_cache_hits"] / max(seq["prefix_cache_queries"], 1),
            "peak_blocks": {b["requests"]: b["peak_blocks"] for b in bursts.values()},
            "burst_seconds": {b["requests"]: round(b["seconds"], 2) for b in bursts.values()},
        })
    return rows


def print_table(res: dict) -> None:
    on, off = summarize(res)
    print("| caching | sequential requests | TTFT cold (s) | TTFT warm median (s) | "
          "TTFT warm p90 (s) | prefix hit rate | burst: requests -> peak KV blocks "
          "(wall s) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in (on, off):
        warm = "-" if r["ttft_warm_median_s"] is None else f"{r['ttft_warm_median_s']:.3f}"
        p90 = "-" if r["ttft_warm_p90_s"] is None else f"{r['ttft_warm_p90_s']:.3f}"
        bursts = ", ".join(f"{n} -> {b} ({r['burst_seconds'][n]} s)"
                           for n, b in r["peak_blocks"].items())
        print(f"| {r['caching']} | {r['sequential_requests']} | {r['ttft_cold_s']:.3f} | "
              f"{warm} | {p90} | {100 * r['hit_rate']:.1f}% | {bursts} |")
    cold_off = off["ttft_cold_s"]
    print(f"\nwarm TTFT (caching on) vs cold: {on['ttft_cold_s'] / on['ttft_warm_median_s']:.1f}x "
          f"lower than its own first request, {cold_off / on['ttft_warm_median_s']:.1f}x lower "
          f"than caching off")
    for n, blocks_off in off["peak_blocks"].items():
        blocks_on = on["peak_blocks"][n]
        print(f"peak KV blocks, {n} requests at once: {blocks_on} with caching vs {blocks_off} "
              f"without ({100 * (1 - blocks_on / blocks_off):.0f}% lower)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--num-requests", type=int, default=100)
    ap.add_argument("--uncached-requests", type=int, default=10,
                    help="requests run with caching off (each a full prefill)")
    ap.add_argument("--system-len", type=int, default=1024)
    ap.add_argument("--suffix-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=8, help="new tokens per burst request")
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    ap.add_argument("--out", default="benchmarks/results/prefix_cache.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.quick:
        args.num_requests, args.uncached_requests, args.system_len = 6, 3, 128
        args.suffix_len, args.output_len = 8, 2
    uncached = min(args.uncached_requests, args.num_requests)
    probe = LLM(args.model, num_threads=args.num_threads, max_model_len=256,
                kv_cache_memory=64 * 2**20)
    prompts = make_prompts(probe.get_tokenizer(), args.num_requests, args.system_len,
                           args.suffix_len)
    del probe
    res: dict = {"machine": {"platform": platform.platform(), "cpu": platform.processor(),
                             "threads": args.num_threads or torch.get_num_threads(),
                             "torch": torch.__version__},
                 "args": vars(args)}
    res["caching_on"] = run_config(args, prompts, True, sorted({args.num_requests, uncached}))
    res["caching_off"] = run_config(args, prompts[:uncached], False, [uncached])
    res["summary"] = summarize(res)
    print_table(res)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
