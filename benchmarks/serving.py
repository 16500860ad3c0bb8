"""Online serving benchmark (like `vllm bench serve`) for any OpenAI-compatible server.

Sends N streaming /v1/completions requests with random token-id prompts of --input-len tokens
and --output-len generated tokens (ignore_eos), either at a fixed concurrency or as a Poisson
process (--request-rate, optionally capped by --max-concurrency), then reports request and
token throughput and TTFT / TPOT / ITL / E2E latency (mean, median, p99).

    pagedllm serve &                                   # default SmolLM2-135M-Instruct
    python benchmarks/serving.py --max-concurrency 32 --num-prompts 256 \\
        --input-len 128 --output-len 128 --result-file serving.json

Several --base-url values benchmark several servers in the same run, one after the other, and
print them side by side. TTFT: request sent -> first chunk with tokens; ITL: gaps between
chunks; TPOT: (E2E - TTFT) / (output tokens - 1), per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import httpx


def prompt_lengths(args: argparse.Namespace, rng: random.Random) -> list[int]:
    """--input-len for every prompt, or (--input-len-max) lengths log-uniform between the
    two: as many prompts of 16-32 tokens as of 1,000-2,000 per doubling, so most are short."""
    if getattr(args, "input_len_max", None) is None:  # namespaces built by other scripts
        return [args.input_len] * args.num_prompts
    lo, hi = math.log(args.input_len), math.log(args.input_len_max)
    return [round(math.exp(rng.uniform(lo, hi))) for _ in range(args.num_prompts)]


@dataclass
class RequestResult:
    ok: bool = False
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)
    error: str = ""


async def one_request(client: httpx.AsyncClient, url: str, model: str, prompt: list[int],
                      output_len: int) -> RequestResult:
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    res = RequestResult(prompt_tokens=len(prompt))
    start = last = time.perf_counter()
    chunks = 0
    try:
        async with client.stream("POST", url, json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                now = time.perf_counter()
                if data.get("choices"):
                    if chunks == 0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    chunks += 1
                    last = now
                elif data.get("usage"):
                    res.output_tokens = data["usage"]["completion_tokens"]
        res.e2e = time.perf_counter() - start
        res.ok = chunks > 0
        if not res.output_tokens:
            res.output_tokens = chunks
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        res.error = repr(exc)
    return res


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": float("nan"), "median": float("nan"), "p99": float("nan")}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"mean": statistics.fmean(values) * 1e3, "median": statistics.median(values) * 1e3,
            "p99": p99 * 1e3}


async def run_one(base_url: str, args: argparse.Namespace) -> dict:
    base_url = base_url.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(600.0),
                                 limits=limits) as client:
        model = args.model
        if model is None:
            model = (await client.get(f"{base_url}/v1/models")).json()["data"][0]["id"]
        rng = random.Random(args.seed)
        prompts = [[rng.randrange(args.token_id_low, args.vocab_size)
                    for _ in range(n)] for n in prompt_lengths(args, rng)]
        url = f"{base_url}/v1/completions"
        for _ in range(args.warmup):
            warm = await one_request(client, url, model, prompts[0], 8)
            if not warm.ok:
                raise SystemExit(f"warm-up request to {url} failed: {warm.error}")
        sem = asyncio.Semaphore(args.max_concurrency or args.num_prompts)

        async def limited(prompt: list[int]) -> RequestResult:
            async with sem:
                return await one_request(client, url, model, prompt, args.output_len)

        start = time.perf_counter()
        tasks = []
        for prompt in prompts:
            tasks.append(asyncio.create_task(limited(prompt)))
            if args.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "base_url": base_url, "model": model, "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "ttft_ms": _stats([r.ttft for r in ok]), "tpot_ms": _stats(tpot),
        "itl_ms": _stats([x for r in ok for x in r.itl]), "e2e_ms": _stats([r.e2e for r in ok]),
    }


def print_table(runs: list[dict]) -> None:
    rows: list[tuple[str, list[str]]] = [
        ("completed / failed", [f"{r['completed']} / {r['failed']}" for r in runs]),
        ("duration (s)", [f"{r['duration_s']:.2f}" for r in runs]),
        ("request throughput (req/s)", [f"{r['request_throughput']:.2f}" for r in runs]),
        ("output throughput (tok/s)", [f"{r['output_throughput']:.1f}" for r in runs]),
        ("total throughput (tok/s)", [f"{r['total_token_throughput']:.1f}" for r in runs]),
    ]
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"),
                       ("e2e_ms", "E2E")):
        for stat in ("mean", "median", "p99"):
            rows.append((f"{label} {stat} (ms)", [f"{r[key][stat]:.1f}" for r in runs]))
    width = max(len(name) for name, _ in rows)
    cols = [max(len(r["base_url"]), 12) for r in runs]
    print(" " * width + "  " + "  ".join(r["base_url"].rjust(c) for r, c in zip(runs, cols, strict=True)))
    for name, vals in rows:
        print(name.ljust(width) + "  " + "  ".join(v.rjust(c) for v, c in zip(vals, cols, strict=True)))
    for r in runs:
        for err in r["errors"]:
            print(f"{r['base_url']}: error: {err}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", action="append", default=None,
                   help="server root, repeatable (default http://127.0.0.1:8000)")
    p.add_argument("--model", default=None, help="default: the first of /v1/models")
    p.add_argument("--api-key", default=None)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--input-len-max", type=int, default=None,
                   help="mixed prompt lengths: each prompt's length drawn log-uniformly "
                   "(long-tailed: most short, a few long) from --input-len to this")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="Poisson arrivals per second (default inf: all at once)")
    p.add_argument("--vocab-size", type=int, default=32000,
                   help="prompt token ids are drawn from [--token-id-low, this)")
    p.add_argument("--token-id-low", type=int, default=100)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-file", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)
    runs = [asyncio.run(run_one(url, args))
            for url in (args.base_url or ["http://127.0.0.1:8000"])]
    print_table(runs)
    if args.result_file:
        meta = {"argv": sys.argv, "python": platform.python_version(),
                "machine": platform.machine(), "node": platform.node(),
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "config": {k: v for k, v in vars(args).items() if k != "api_key"}}
        with open(args.result_file, "w") as f:
            json.dump({"meta": meta, "runs": runs}, f, indent=2)
    return 0 if all(r["failed"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
