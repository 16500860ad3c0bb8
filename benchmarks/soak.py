"""Soak: mixed traffic with client disconnects against `pagedllm serve` for a long while.

    python benchmarks/soak.py                          # default model, 10 minutes
    python benchmarks/soak.py --duration 60 --model DIR --concurrency 8   # shorter

`--concurrency` closed-loop clients send completions and chat requests, half streaming,
with random prompts (pydoc prose) and max_tokens; `--disconnect` of them (30%) hang up at a
random point (before the first byte, during prefill, mid-stream, or a non-streaming request
while it runs). The server runs with `--max-num-queued-reqs`, so bursts get 429s (a rejected
client waits Retry-After). Every `--sample-every` seconds it records the server's RSS and
gauges. At the end, once the server is idle: leaked blocks (KV blocks still in use, from
/metrics and the pool size in the server log) must be 0, and the engine's idle-time
invariant check must report no violation.

Reports per minute: completed / aborted / rejected / errors and p50 / p99 latency of the
completed requests; RSS at start and end; writes benchmarks/results/soak.json and a PNG
(RSS and latency over time).

`--hostile 0.1` (issue #28): the second half of the run sends that fraction of hostile
requests among the normal ones (a 2 MB prompt, 1,000 prompts in one request, a 3,000-property
JSON schema, a request chat template, deep nesting, NaN, a lone surrogate, wrong types); the
report compares the normal requests' p50 / p99 latency of the two halves (same server, same
run) and counts hostile answers that were 5xx (must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import re
import sys
import time
from pathlib import Path

import httpx

from pagedllm.entrypoints.launcher import ServerProcess, free_port

logger = logging.getLogger("benchmarks.soak")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def gauges(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        m = re.match(r"^(pagedllm:[a-z_]+)(\{[^}]*\})?\s+(\S+)$", line)
        if m and (m.group(2) is None or "model_name" in m.group(2) and "," not in m.group(2)):
            out[m.group(1)] = float(m.group(3))
    return out


def hostile_bodies() -> list[tuple[str, bytes]]:
    """(path, raw JSON body) of each hostile kind; all but two are refused with a 4xx."""
    deep: dict = {"type": "string"}
    for _ in range(100):
        deep = {"type": "object", "properties": {"a": deep}}
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"}
                                               for i in range(3000)}}
    msg = [{"role": "user", "content": "hi"}]
    bodies = [
        ("/v1/completions", {"prompt": "word " * 400_000, "max_tokens": 1}),
        ("/v1/completions", {"prompt": [[28, 29]] * 1000, "max_tokens": 1}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 4,
                             "structured_outputs": {"json": schema}}),
        ("/v1/chat/completions", {"messages": msg, "chat_template": "{% for i in range("
                                  "12000) %}{% for j in range(12000) %}{% endfor %}{% endfor %}"}),
        ("/v1/completions", {"prompt": "x", "structured_outputs": {"json": deep}}),
        ("/v1/completions", {"prompt": "a\ud800b"}),
        ("/v1/completions", {"prompt": [True, False]}),
        ("/v1/completions", {"prompt": "x", "max_tokens": "10"}),
    ]
    out = [(path, json.dumps(body).encode()) for path, body in bodies]
    out.append(("/v1/completions", b'{"prompt": "x", "temperature": NaN}'))
    return out


class Traffic:
    def __init__(self, url: str, args, texts: list[str]) -> None:
        self.url, self.args, self.texts = url, args, texts
        self.records: list[dict] = []
        self.t0 = time.monotonic()
        self.hostile = hostile_bodies() if args.hostile else []

    def body(self, rng: random.Random, chat: bool, stream: bool) -> tuple[str, dict]:
        text = rng.choice(self.texts)
        start = rng.randrange(max(1, len(text) - 400))
        prompt = text[start:start + rng.randrange(40, 400)]
        common = {"max_tokens": rng.randrange(16, 128), "stream": stream,
                  "temperature": rng.choice([0.0, 0.7])}
        if chat:
            return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                            **common}
        return "/v1/completions", {"prompt": prompt, **common}

    async def one_hostile(self, c: httpx.AsyncClient, rng: random.Random) -> None:
        path, raw = rng.choice(self.hostile)
        start = time.monotonic()
        try:
            r = await c.post(path, content=raw, headers={"Content-Type": "application/json"})
            outcome = "hostile_5xx" if r.status_code >= 500 else "hostile_answered"
        except httpx.HTTPError as exc:
            outcome = f"hostile_{type(exc).__name__}"
        self.records.append({"t": start - self.t0, "latency": time.monotonic() - start,
                             "outcome": outcome, "stream": False, "chat": False})

    async def one(self, c: httpx.AsyncClient, rng: random.Random) -> None:
        second_half = time.monotonic() - self.t0 >= self.args.duration / 2
        if self.hostile and second_half and rng.random() < self.args.hostile:
            await self.one_hostile(c, rng)
            return
        chat, stream = rng.random() < 0.5, rng.random() < 0.5
        path, body = self.body(rng, chat, stream)
        hang = rng.random() < self.args.disconnect
        start = time.monotonic()
        outcome, retry_after = "completed", 0.0

        async def call():
            if not stream:
                return await c.post(path, json=body)
            async with c.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    return r
                n = 0
                async for line in r.aiter_lines():
                    n += bool(line)
                    if hang and n >= hang_after:
                        raise _HungUp
                return r

        hang_after = rng.randrange(1, 16)
        task = asyncio.create_task(call())
        try:
            if hang and (not stream or rng.random() < 0.4):
                # Before the first byte, during prefill, or while it runs.
                await asyncio.wait_for(asyncio.shield(task), rng.uniform(0.0, 3.0))
            r = await task
            if r.status_code == 429:
                outcome, retry_after = "rejected", float(r.headers.get("Retry-After", 1))
            elif r.status_code != 200:
                outcome = f"error_{r.status_code}"
        except (TimeoutError, _HungUp):
            task.cancel()
            outcome = "aborted"
        except httpx.HTTPError as exc:
            outcome = f"error_{type(exc).__name__}"
        end = time.monotonic()
        self.records.append({"t": start - self.t0, "latency": end - start, "outcome": outcome,
                             "stream": stream, "chat": chat})
        if retry_after:
            await asyncio.sleep(retry_after)

    async def run(self) -> None:
        deadline = self.t0 + self.args.duration
        limits = httpx.Limits(max_connections=self.args.concurrency * 2)

        async def worker(i: int, c: httpx.AsyncClient) -> None:
            rng = random.Random(self.args.seed * 1000 + i)
            while time.monotonic() < deadline:
                await self.one(c, rng)

        async with httpx.AsyncClient(base_url=self.url, timeout=600, limits=limits) as c:
            await asyncio.gather(*(worker(i, c) for i in range(self.args.concurrency)))


class _HungUp(Exception):
    pass


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--disconnect", type=float, default=0.3)
    ap.add_argument("--max-num-queued-reqs", type=int, default=8)
    ap.add_argument("--num-threads", type=int, default=2)
    ap.add_argument("--kv-cache-memory", default="512MiB")
    ap.add_argument("--sample-every", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hostile", type=float, default=0.0,
                    help="fraction of hostile requests in the second half of the run")
    ap.add_argument("--out", default="benchmarks/results/soak.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from pydoc_data.topics import topics

    texts = [t for t in topics.values() if len(t) > 500]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve",
           *([args.model] if args.model else []), "--port", str(port), "--disable-access-log",
           "--num-threads", str(args.num_threads), "--kv-cache-memory", args.kv_cache_memory,
           "--max-num-queued-reqs", str(args.max_num_queued_reqs)]
    with ServerProcess(cmd, port, out.with_suffix(".server.log")) as srv:
        srv.wait_ready(timeout=600)
        pid = srv.proc.pid
        m = re.search(r"-> (\d+) blocks", srv.log())
        num_blocks = int(m.group(1)) if m else None
        traffic = Traffic(srv.base_url, args, texts)
        samples: list[dict] = []

        async def sampler() -> None:
            while time.monotonic() < traffic.t0 + args.duration + 1:
                try:
                    g = await asyncio.to_thread(gauges, srv.base_url)
                except httpx.HTTPError as exc:  # a slow answer is data too, not the end
                    logger.warning("metrics sample failed: %r", exc)
                    g = {}
                samples.append({"t": time.monotonic() - traffic.t0, "rss_mib": rss_mib(pid),
                                "running": g.get("pagedllm:num_requests_running"),
                                "waiting": g.get("pagedllm:num_requests_waiting"),
                                "kv_usage": g.get("pagedllm:kv_cache_usage_perc")})
                await asyncio.sleep(args.sample_every)

        async def both() -> None:
            await asyncio.gather(traffic.run(), sampler())

        logger.info("soak: %d clients for %.0f s against %s", args.concurrency, args.duration,
                    srv.base_url)
        asyncio.run(both())
        deadline = time.monotonic() + 120
        while True:  # drain: aborted requests are freed on the next step
            g = gauges(srv.base_url)
            idle = (g["pagedllm:num_requests_running"] == 0
                    and g["pagedllm:num_requests_waiting"] == 0)
            if idle and g["pagedllm:kv_cache_usage_perc"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        final_rss = rss_mib(pid)
        leaked = round(g["pagedllm:kv_cache_usage_perc"] * num_blocks) if num_blocks else None
    recs = traffic.records
    minutes = []
    for start in range(0, int(args.duration), 60):
        win = [r for r in recs if start <= r["t"] < start + 60]
        lat = [r["latency"] for r in win if r["outcome"] == "completed"]
        minutes.append({
            "minute": start // 60, "completed": len(lat),
            "aborted": sum(r["outcome"] == "aborted" for r in win),
            "rejected": sum(r["outcome"] == "rejected" for r in win),
            "errors": sum(r["outcome"].startswith("error") for r in win),
            "p50_s": percentile(lat, 0.5), "p99_s": percentile(lat, 0.99)})
    totals = {k: sum(m[k] for m in minutes) for k in ("completed", "aborted", "rejected",
                                                       "errors")}
    halves = []
    for name, lo, hi in (("first half (normal only)", 0, args.duration / 2),
                         (f"second half ({args.hostile:.0%} hostile)", args.duration / 2,
                          args.duration)):
        lat = [r["latency"] for r in recs if lo <= r["t"] < hi and r["outcome"] == "completed"]
        halves.append({"half": name, "completed": len(lat), "p50_s": percentile(lat, 0.5),
                       "p99_s": percentile(lat, 0.99),
                       "hostile_sent": sum(r["outcome"].startswith("hostile") and lo <= r["t"]
                                           < hi for r in recs),
                       "hostile_5xx_or_failed": sum(r["outcome"].startswith("hostile")
                                                    and r["outcome"] != "hostile_answered"
                                                    and lo <= r["t"] < hi for r in recs)})
    result = {"args": vars(args), "totals": totals, "minutes": minutes, "halves": halves,
              "samples": samples,
              "rss_mib": {"first": samples[0]["rss_mib"] if samples else None,
                          "final": final_rss},
              "leaked_blocks": leaked, "num_blocks": num_blocks,
              "invariant_checks": g.get("pagedllm:invariant_checks_total"),
              "invariant_violations": g.get("pagedllm:invariant_violations_total"),
              "errors_by_kind": {k: sum(r["outcome"] == k for r in recs)
                                 for k in {r["outcome"] for r in recs}
                                 if k.startswith("error")}}
    print("| minute | completed | aborted | rejected | errors | p50 latency (s) | "
          "p99 latency (s) |\n|---|---|---|---|---|---|---|")
    for m in minutes:
        p50 = f"{m['p50_s']:.2f}" if m["p50_s"] is not None else "-"
        p99 = f"{m['p99_s']:.2f}" if m["p99_s"] is not None else "-"
        print(f"| {m['minute']} | {m['completed']} | {m['aborted']} | {m['rejected']} | "
              f"{m['errors']} | {p50} | {p99} |")
    if args.hostile:
        print("| half | completed normal | p50 (s) | p99 (s) | hostile sent | hostile 5xx "
              "or failed |\n|---|---|---|---|---|---|")
        for h in halves:
            print(f"| {h['half']} | {h['completed']} | {h['p50_s'] or 0:.2f} | "
                  f"{h['p99_s'] or 0:.2f} | {h['hostile_sent']} | {h['hostile_5xx_or_failed']} |")
    print(f"totals {totals}; RSS {result['rss_mib']['first']:.0f} -> {final_rss:.0f} MiB; "
          f"leaked blocks {leaked} of {num_blocks}; invariant checks "
          f"{result['invariant_checks']:.0f}, violations {result['invariant_violations']:.0f}")
    out.write_text(json.dumps(result, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
        a1.plot([s["t"] / 60 for s in samples], [s["rss_mib"] for s in samples])
        a1.set_ylabel("server RSS (MiB)")
        a1.set_ylim(bottom=0)
        xs = [m["minute"] + 0.5 for m in minutes]
        a2.plot(xs, [m["p50_s"] for m in minutes], "o-", label="p50")
        a2.plot(xs, [m["p99_s"] for m in minutes], "s-", label="p99")
        a2.set_ylabel("latency of completed requests (s)")
        a2.set_xlabel("minutes")
        a2.legend()
        fig.suptitle(f"soak: {args.concurrency} clients, {args.disconnect:.0%} disconnects")
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=100)
    except ImportError:
        logger.warning("matplotlib missing: no PNG")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
