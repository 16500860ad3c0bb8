"""Hostile input and vanishing clients against a real server (tiny model):

* schema fuzzing with schemathesis from the server's own /openapi.json (bounded examples):
  no 5xx, every 4xx in the OpenAI error shape;
* a disconnect soak: concurrent clients hang up at random points (before the first byte,
  during prefill, mid-stream, non-streaming while running);

and after each: the server alive, nothing running or waiting, KV usage 0, the engine's own
idle-time invariant check clean (pagedllm:invariant_violations_total), RSS flat.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from server_harness import TINY_SERVER_ARGS, parse_sse, scrape, start_server, wait_idle

ARGS = [*TINY_SERVER_ARGS, "--max-model-len", "256", "--max-num-seqs", "32"]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path, ARGS, name="robust")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(f"{server.base_url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def assert_clean(url: str) -> dict[str, float]:
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    m = wait_idle(url, timeout=30)
    assert m["pagedllm:num_requests_running"] == 0
    assert m["pagedllm:num_requests_waiting"] == 0
    assert m["pagedllm:kv_cache_usage_perc"] == 0
    assert m["pagedllm:invariant_violations_total"] == 0
    return m


@schema.parametrize()
@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck), database=None, derandomize=True)
def test_schema_fuzz_no_5xx_and_openai_errors(case):
    """Every route, every generated body: never a 5xx; errors in the route's API shape
    (OpenAI's, or Anthropic's on /v1/messages)."""
    if isinstance(case.body, dict):
        # A random `model` is a 404 every time; leave it out so the sampling fields get tried.
        case.body.pop("model", None)
        for key, cap in (("max_tokens", 32), ("max_completion_tokens", 32), ("n", 4)):
            if isinstance(case.body.get(key), int) and case.body[key] > cap:
                case.body[key] = cap  # bounded work per example on a 2-core machine
        if "messages" in case.body and case.body.get("max_tokens") is None \
                and case.body.get("max_completion_tokens") is None:
            case.body["max_completion_tokens"] = 32
    response = case.call(timeout=60)
    assert response.status_code < 500, (case.method, case.path, case.body, response.text)
    if response.status_code >= 400 and case.path != "/health":
        body = response.json()
        err = body["error"]
        assert isinstance(err["message"], str) and isinstance(err["type"], str), response.text
        if case.path.startswith("/v1/messages"):  # Anthropic's shape: {"type": "error", ...}
            assert body["type"] == "error", response.text
        else:  # OpenAI's
            assert {"param", "code"} <= set(err), response.text


def test_after_fuzzing_the_server_is_clean(server):
    assert_clean(server.base_url)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def _client(c: httpx.AsyncClient, i: int, rng: random.Random) -> str:
    """One request with a random way of ending; returns what happened."""
    kind = rng.choice(["full", "stream", "hangup_first_byte", "hangup_prefill",
                       "hangup_stream", "hangup_running", "chat_stream"])
    long_prompt = [rng.randrange(2, 500) for _ in range(rng.randrange(100, 200))]
    body = {"prompt": f"request {i} says hello", "max_tokens": rng.randrange(8, 48),
            "temperature": rng.choice([0, 0.8]), "ignore_eos": True}
    if kind == "full":
        r = await c.post("/v1/completions", json={**body, "n": rng.choice([1, 2])})
        assert r.status_code == 200, r.text
        assert all(ch["finish_reason"] == "length" for ch in r.json()["choices"])
    elif kind in ("stream", "chat_stream"):
        path, payload = ("/v1/completions", {**body, "stream": True}) if kind == "stream" else (
            "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                     "max_tokens": body["max_tokens"], "stream": True})
        r = await c.post(path, json=payload)
        events = parse_sse(r.text)
        assert r.status_code == 200 and events[-1] == "[DONE]"
    elif kind == "hangup_first_byte":
        task = asyncio.create_task(c.post("/v1/completions", json=body))
        await asyncio.sleep(rng.uniform(0, 0.005))
        task.cancel()
    elif kind == "hangup_prefill":
        task = asyncio.create_task(c.post("/v1/completions", json={
            **body, "prompt": long_prompt, "stream": rng.random() < 0.5}))
        await asyncio.sleep(rng.uniform(0.005, 0.05))
        task.cancel()
    elif kind == "hangup_stream":
        async with c.stream("POST", "/v1/completions",
                            json={**body, "stream": True, "max_tokens": 200}) as r:
            stop_after = rng.randrange(1, 8)
            n = 0
            async for line in r.aiter_lines():
                n += bool(line)
                if n >= stop_after:
                    break
    else:  # non-streaming, the client gives up while it runs
        task = asyncio.create_task(c.post("/v1/completions", json={**body, "max_tokens": 200}))
        await asyncio.sleep(rng.uniform(0.02, 0.2))
        task.cancel()
    return kind


async def _soak(url: str, num: int, concurrency: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    sem = asyncio.Semaphore(concurrency)
    kinds: dict[str, int] = {}

    async def run(i: int, c: httpx.AsyncClient) -> None:
        async with sem:
            try:
                kind = await _client(c, i, rng)
            except asyncio.CancelledError:
                kind = "cancelled"
            kinds[kind] = kinds.get(kind, 0) + 1

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
        await asyncio.gather(*(run(i, c) for i in range(num)))
    return kinds


def test_disconnect_soak_leaves_nothing_behind(server):
    url = server.base_url
    asyncio.run(_soak(url, 40, 24, seed=1))  # warm-up: allocator pools, caches
    m0 = assert_clean(url)
    rss0 = _rss_kib(server.proc.pid)
    t0 = time.monotonic()
    kinds = asyncio.run(_soak(url, 300, 24, seed=2))
    elapsed = time.monotonic() - t0
    m = assert_clean(url)
    rss = _rss_kib(server.proc.pid)
    hangups = sum(v for k, v in kinds.items() if k.startswith("hangup"))
    assert hangups >= 60 and kinds.get("full", 0) + kinds.get("stream", 0) >= 30, kinds
    assert m["pagedllm:invariant_checks_total"] > m0["pagedllm:invariant_checks_total"]
    assert m['pagedllm:request_success_total{finished_reason="abort"}'] > \
        m0['pagedllm:request_success_total{finished_reason="abort"}']
    assert rss < 1.10 * rss0, (rss0, rss, elapsed)
    # Still serving normally.
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "after", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert scrape(url)["pagedllm:invariant_violations_total"] == 0
