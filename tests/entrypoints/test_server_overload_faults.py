"""Overload (429 + Retry-After past the queue limits, 413 past the body limit, admitted
requests undisturbed), fault containment over HTTP (500 / error event then [DONE] for the
faulty request only), a dead engine (pending requests fail at once, /health 503, exit 1),
and clean start-up errors."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import httpx
import pytest
from server_harness import TINY_SERVER_ARGS, parse_sse, scrape, start_server, wait_idle

from pagedllm.entrypoints import cli
from pagedllm.entrypoints.launcher import free_port

LIMIT_ARGS = ["--max-num-seqs", "1", "--max-num-queued-reqs", "2",
              "--max-num-queued-tokens", "600", "--max-request-body-bytes", "20000"]
FAULTS = {"PAGEDLLM_TEST_FAULTS": "output=FAULTOUT;logits=FAULTNAN"}
LONG = {"max_tokens": 1000, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path, [*TINY_SERVER_ARGS, *LIMIT_ARGS],
                       env=FAULTS, name="overload")
    yield srv
    srv.stop()


def assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    assert set(err) == {"message", "type", "param", "code"}
    return err


def _gauge(metrics: str, name: str) -> float:
    line = next(x for x in metrics.splitlines()
                if x.startswith(f"pagedllm:num_requests_{name}{{"))
    return float(line.split()[-1])


def test_queue_limits_answer_429_and_admitted_requests_finish(server):
    url = server.base_url

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            async with c.stream("POST", "/v1/completions", json={
                    "prompt": "Hello", "stream": True, **LONG}) as running:
                lines = running.aiter_lines()
                await anext(lines)  # it runs (max_num_seqs 1): the next ones wait
                queued = [asyncio.create_task(c.post("/v1/completions", json={
                    "prompt": f"Hello {i}", "max_tokens": 5})) for i in range(2)]
                deadline = time.monotonic() + 30
                while _gauge((await c.get("/metrics")).text, "waiting") != 2:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.005)
                r = await c.post("/v1/completions", json={"prompt": "one more", **LONG})
                err = assert_openai_error(r, 429)
                assert err["code"] == "rate_limit_exceeded"
                assert "--max-num-queued-reqs" in err["message"]
                assert int(r.headers["Retry-After"]) >= 1
            # The running request's client left; the queued ones are undisturbed.
            for resp in await asyncio.gather(*queued):
                assert resp.status_code == 200
                assert resp.json()["usage"]["completion_tokens"] >= 1
    asyncio.run(main())
    # A prompt that alone passes the queued-token limit could never be admitted: retrying
    # cannot help, so 400 naming that limit (not 429, which clients retry forever).
    r = httpx.post(f"{url}/v1/completions", json={"prompt": [5] * 700,
                                                  "max_tokens": 1})
    err = assert_openai_error(r, 400)
    assert "--max-num-queued-tokens" in err["message"] and err["code"] == "request_too_large"
    m = wait_idle(url)
    assert m['pagedllm:request_rejected_total{reason="queued_reqs"}'] == 1
    assert m["pagedllm:kv_cache_usage_perc"] == 0


def test_body_over_the_limit_is_refused_before_parsing(server):
    url = server.base_url
    big = b'{"prompt": "' + b"x" * 30000 + b'"}'
    r = httpx.post(f"{url}/v1/completions", content=big,
                   headers={"Content-Type": "application/json"})
    assert assert_openai_error(r, 413)["code"] == "request_too_large"

    def chunks():  # no Content-Length: read up to the limit, then refused
        for _ in range(40):
            yield b"x" * 1000

    r = httpx.post(f"{url}/v1/completions", content=chunks(),
                   headers={"Content-Type": "application/json"})
    assert_openai_error(r, 413)
    assert scrape(url)['pagedllm:request_rejected_total{reason="body_too_large"}'] == 2
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "small", "max_tokens": 2})
    assert r.status_code == 200


def test_bounds_on_logprobs_and_n(server):
    url = server.base_url
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "logprobs": 21})
    assert "max_logprobs (20" in assert_openai_error(r, 400)["message"]
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "n": 129})
    assert "n must be in [1, 128]" in assert_openai_error(r, 400)["message"]


def test_a_faulty_request_fails_alone(server):
    url = server.base_url

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            good = asyncio.create_task(c.post("/v1/completions", json={
                "prompt": "Hello", "max_tokens": 20, "ignore_eos": True, "temperature": 0}))
            bad = await c.post("/v1/completions", json={"prompt": "FAULTOUT", "max_tokens": 5})
            err = assert_openai_error(bad, 500)
            assert "injected output-processing fault" in err["message"]
            r = await c.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "FAULTNAN"}], "stream": True})
            events = parse_sse(r.text)
            assert events[-1] == "[DONE]" and "error" in events[-2]
            assert "not finite" in events[-2]["error"]["message"]
            resp = await good
            assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 20
    asyncio.run(main())
    m = wait_idle(url)
    assert m["pagedllm:kv_cache_usage_perc"] == 0
    assert httpx.get(f"{url}/health").status_code == 200


def test_dead_engine_fails_everything_health_503_and_exit_1(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path, TINY_SERVER_ARGS,
                       env={"PAGEDLLM_TEST_FAULTS": "die=FAULTDIE"}, name="dead")
    url = srv.base_url
    try:
        with httpx.Client(base_url=url, timeout=30) as c, c.stream(
                "POST", "/v1/completions", json={"prompt": "Hello", "stream": True,
                                                 "max_tokens": 500, **{"ignore_eos": True}}
        ) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")  # it streams
            t0 = time.monotonic()
            killer = c.post("/v1/completions", json={"prompt": "FAULTDIE", "max_tokens": 2})
            assert killer.status_code >= 500
            rest = [line for line in lines if line]
            assert rest[-1] == "data: [DONE]" and '"error"' in rest[-2]
            assert time.monotonic() - t0 < 5
            h = c.get("/health")
            assert h.status_code == 503, h.text
            late = c.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
            assert late.status_code == 503
        assert srv.proc.wait(timeout=30) == 1
    finally:
        srv.stop()


def test_startup_errors_are_one_line_and_exit_1(tiny_model_path, capsys):
    def fails(*args: str) -> str:
        assert cli.main(["serve", *args, "--num-threads", "1"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("pagedllm: error: ") and err.count("\n") == 1, err
        return err

    assert "not found" in fails("/nonexistent/model")
    assert "max_model_len=99999 exceeds" in fails(tiny_model_path, "--max-model-len", "99999")
    assert "less than one sequence of max_model_len" in fails(
        tiny_model_path, "--kv-cache-memory", "64KiB", "--max-model-len", "1024")


def test_port_in_use_fails_before_loading_the_model(tiny_model_path):
    from pagedllm.entrypoints.api_server import bind_socket

    port = free_port()
    with bind_socket("127.0.0.1", port) as taken:
        taken.listen()
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "pagedllm.entrypoints.cli", "serve",
                            "/nonexistent/model", "--port", str(port)],
                           capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    # The model argument is bad too, but the port is checked first.
    assert p.stderr == f"pagedllm: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert time.monotonic() - t0 < 60
