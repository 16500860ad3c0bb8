"""Scaling out on this machine: tensor parallelism (TP=1 vs TP=2) and data parallelism
(DP=1 vs DP=2 behind one server), on SmolLM2-135M-Instruct (fp32: TP needs unquantized
weights, so the default GGUF model loads with --quantization none).

    python benchmarks/scale.py                      # both parts, writes results/scale.json
    python benchmarks/scale.py --skip-dp --decode-steps 16 --num-prompts 32   # short run

TP part (offline engine): the ms of one decode step of --num-seqs sequences and of one
prefill of --prompt-len tokens, TP=1 with all cores vs TP=2 with cores/2 threads per rank,
and whether TP=2's greedy tokens equal TP=1's. DP part: `pagedllm serve -dp N` and
benchmarks/serving.py's client at --concurrency (32) clients. Only same-run ratios count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
logger = logging.getLogger("scale")


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "?"
    return " ".join(sorted(set(re.findall(r"avx512[a-z_]*|avx2", text))))


def bench_tp(tp: int, threads: int, args) -> dict:
    from pagedllm import SamplingParams
    from pagedllm.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(
        model=args.model, quantization="none", tensor_parallel_size=tp, num_threads=threads,
        kv_cache_memory="1GiB", max_model_len=2048, generation_config="vllm")
    try:
        greedy = SamplingParams(max_tokens=args.decode_steps + 1, temperature=0,
                                ignore_eos=True)
        prompts = [[(17 * i + 31 * j) % 40000 + 100 for j in range(32)]
                   for i in range(args.num_seqs)]
        for i, p in enumerate(prompts):
            engine.add_request(p, greedy, request_id=f"d{i}")
        engine.step()  # the prefills
        t0 = time.perf_counter()
        steps = 0
        tokens: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    tokens[out.request_id] = list(out.outputs[0].token_ids)
            steps += 1
        decode_ms = (time.perf_counter() - t0) * 1e3 / max(1, steps)
        one = SamplingParams(max_tokens=1, temperature=0)
        engine.add_request([(7 * j) % 40000 + 100 for j in range(args.prompt_len)], one,
                           request_id="prefill")
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        prefill_ms = (time.perf_counter() - t0) * 1e3
    finally:
        engine.shutdown()
    return {"tp": tp, "threads_per_rank": threads, "decode_step_ms": decode_ms,
            "decode_tok_s": args.num_seqs * 1e3 / decode_ms,
            "prefill_ms": prefill_ms, "prefill_tok_s": args.prompt_len * 1e3 / prefill_ms,
            "tokens": [tokens[k] for k in sorted(tokens)]}


def bench_dp(dp: int, args, log_dir: Path) -> dict:
    from serving import run_one

    from pagedllm.entrypoints.launcher import ServerProcess, free_port

    port = free_port()
    cmd = [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve", "--port", str(port),
           "--data-parallel-size", str(dp), "--disable-access-log",
           "--disable-log-requests", "--kv-cache-memory", "1GiB", "--max-model-len", "2048"]
    with ServerProcess(cmd, port, log_dir / f"dp{dp}.log").wait_ready(timeout=600) as server:
        client_args = argparse.Namespace(
            api_key=None, model=None, seed=0, token_id_low=100, vocab_size=40000,
            input_len=args.input_len, output_len=args.output_len,
            num_prompts=args.num_prompts, warmup=1, max_concurrency=args.concurrency,
            request_rate=float("inf"))
        result = asyncio.run(run_one(server.base_url, client_args))
    result["dp"] = dp
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    p.add_argument("--num-seqs", type=int, default=8, help="TP: sequences decoding together")
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=512, help="TP: prefill length")
    p.add_argument("--concurrency", type=int, default=32, help="DP: clients")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--skip-tp", action="store_true")
    p.add_argument("--skip-dp", action="store_true")
    p.add_argument("--result-file", default=str(HERE / "results" / "scale.json"))
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "cpu_flags": cpu_flags(), "load_avg": os.getloadavg(),
            "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "args": vars(args)}
    out: dict = {"meta": meta}
    if not args.skip_tp:
        cores = os.cpu_count() or 1
        # TP=1 with all cores and with a rank's share: separates TP from the thread count.
        configs = [(1, cores), (1, max(1, cores // 2)), (2, max(1, cores // 2))]
        runs = [bench_tp(tp, threads, args) for tp, threads in configs]
        same = runs[0]["tokens"] == runs[2]["tokens"]
        for r in runs:
            r.pop("tokens")
        out["tp"] = {"runs": runs, "greedy_identical": same}
        print(f"\nTP on {meta['cpus']} CPUs ({meta['cpu_flags']}), {args.num_seqs} seqs, "
              f"prefill {args.prompt_len} tokens; TP=2 greedy identical to TP=1: {same}")
        print("| TP | threads/rank | decode step ms | decode tok/s | prefill ms | prefill tok/s |")
        print("|---:|---:|---:|---:|---:|---:|")
        for r in runs:
            print(f"| {r['tp']} | {r['threads_per_rank']} | {r['decode_step_ms']:.1f} | "
                  f"{r['decode_tok_s']:.0f} | {r['prefill_ms']:.0f} | {r['prefill_tok_s']:.0f} |")
        for base in runs[:2]:
            print(f"TP=2 / TP=1 ({base['threads_per_rank']} threads): decode step time "
                  f"{runs[2]['decode_step_ms'] / base['decode_step_ms']:.2f}x, prefill time "
                  f"{runs[2]['prefill_ms'] / base['prefill_ms']:.2f}x")
    if not args.skip_dp:
        log_dir = Path(tempfile.mkdtemp(prefix="pagedllm-scale-"))  # the servers' logs
        runs = [bench_dp(dp, args, log_dir) for dp in (1, 2)]
        out["dp"] = runs
        print(f"\nDP serving, {args.concurrency} clients, {args.num_prompts} requests of "
              f"{args.input_len} in / {args.output_len} out")
        print("| DP | ok | failed | req/s | output tok/s | TTFT p50 ms | TPOT p50 ms |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for r in runs:
            print(f"| {r['dp']} | {r['completed']} | {r['failed']} | "
                  f"{r['request_throughput']:.2f} | {r['output_throughput']:.0f} | "
                  f"{r['ttft_ms']['median']:.0f} | {r['tpot_ms']['median']:.0f} |")
        print(f"DP=2 / DP=1 output throughput: "
              f"{runs[1]['output_throughput'] / runs[0]['output_throughput']:.2f}x")
    Path(args.result_file).parent.mkdir(parents=True, exist_ok=True)
    Path(args.result_file).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
