"""API key, SIGTERM with --shutdown-timeout 0 (in-flight requests aborted with an error event,
exit 0), and 503 while shutting down. The draining shutdown: test_server_shutdown.py."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from server_harness import TINY_SERVER_ARGS, parse_sse, start_server

from pagedllm.engine.async_engine import AsyncEngine
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.entrypoints.api_server import build_app
from pagedllm.entrypoints.args import add_server_args
from pagedllm.entrypoints.cli import build_parser

KEY = "sk-test-123"


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    """Key from the environment; the module's last test stops it with SIGTERM."""
    srv = start_server(tmp_path_factory, tiny_model_path,
                       [*TINY_SERVER_ARGS, "--shutdown-timeout", "0"],
                       env={"PAGEDLLM_API_KEY": KEY})
    yield srv
    srv.stop()


def test_api_key_flag_and_env(monkeypatch):
    args = build_parser().parse_args(["serve", "m", "--api-key", "k1", "--port", "9"])
    assert (args.model, args.api_key, args.port, args.host) == ("m", "k1", 9, "127.0.0.1")
    import argparse

    monkeypatch.setenv("PAGEDLLM_API_KEY", "from-env")
    p = argparse.ArgumentParser()
    add_server_args(p)
    assert p.parse_args([]).api_key == "from-env"


def test_api_key_required(server):
    url = server.base_url
    for key in ("wrong", KEY + "x", KEY[:-1]):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
    assert httpx.get(f"{url}/v1/models").status_code == 401  # no header at all
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "x"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.post(f"{url}/tokenize", json={"prompt": "x"}).status_code == 401
    assert httpx.post(f"{url}/detokenize", json={"tokens": [1]}).status_code == 401
    for open_path in ("/health", "/metrics", "/version"):
        assert httpx.get(f"{url}{open_path}").status_code == 200
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    out = client.completions.create(model=client.models.list().data[0].id, prompt="ok",
                                    max_tokens=3)
    assert out.usage.completion_tokens >= 1
    headers = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(f"{url}/tokenize", json={"prompt": "x"}, headers=headers).status_code == 200


def test_sigterm_without_drain_ends_streams_with_an_error_event_and_exits_0(server):
    body = {"prompt": "long", "max_tokens": 900, "temperature": 0, "ignore_eos": True,
            "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body,
                      headers=headers, timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        t0 = time.monotonic()
        server.proc.terminate()  # SIGTERM
        events = parse_sse("".join(f"{line}\n\n" for line in lines if line))
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["type"] == "service_unavailable"  # not finish_reason "abort"
    assert all(c["finish_reason"] is None for e in events[:-2] for c in e["choices"])
    assert server.terminate(timeout=30) == 0
    assert time.monotonic() - t0 < 15
    assert "Traceback" not in server.log()


def test_503_while_shutting_down(tiny_model_path):
    """In-process (the window between SIGTERM and the listener closing is too short to hit
    from outside): once shutdown began, generation and /health answer 503."""
    engine = AsyncEngine(LLMEngine.from_engine_args(model=tiny_model_path,
                                                    kv_cache_memory="4MiB"))
    app = build_app(engine)

    async def go():
        engine.start()
        try:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                r = await c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
                assert r.status_code == 200
                engine.begin_shutdown()
                r = await c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
                assert r.status_code == 503
                assert r.json()["error"]["type"] == "service_unavailable"
                assert (await c.get("/health")).status_code == 503
                assert (await c.get("/metrics")).status_code == 200
        finally:
            await asyncio.to_thread(engine.stop)

    asyncio.run(go())
