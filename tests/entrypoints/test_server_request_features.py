"""Request fields that were accepted and ignored before issue #28, now implemented, against a
real server (tiny model, --scheduling-policy priority, one sequence at a time): priority
scheduling, X-Request-Id / request_id, return_token_ids, stream_options.continuous_usage_stats.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from server_harness import TINY_SERVER_ARGS, parse_sse, scrape, start_server, wait_idle

ARGS = [*TINY_SERVER_ARGS, "--scheduling-policy", "priority", "--max-num-seqs", "1"]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path, ARGS, name="features")
    yield srv
    srv.stop()


def test_priority_reaches_the_engine(server):
    """The order itself is tested without timing races in tests/core/
    test_priority_scheduling.py and tests/engine/test_priority_engine.py (through HTTP it
    depends on how fast the tiny model runs); here: the field is taken (a fcfs server
    answers 400, see test_server_hostile.py) and requests of every priority finish."""
    url = server.base_url

    async def main() -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            rs = await asyncio.gather(*(c.post("/v1/completions", json={
                "prompt": f"job {p}", "max_tokens": 3, "ignore_eos": True, "priority": p})
                for p in (5, -3, 0, 2**31)))
        return [r.status_code for r in rs]

    assert asyncio.run(main()) == [200, 200, 200, 200]
    assert scrape(url)['pagedllm:request_success_total{finished_reason="length"}'] >= 4


def test_request_id_header_and_field_are_used_and_echoed(server):
    url = server.base_url
    r = httpx.post(f"{url}/v1/completions", headers={"X-Request-Id": "trace-42"},
                   json={"prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "trace-42" and r.json()["id"] == "cmpl-trace-42"
    r = httpx.post(f"{url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "request_id": "chat-7"})
    assert r.json()["id"] == "chatcmpl-chat-7" and r.headers["x-request-id"] == "chat-7"
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert r.headers["x-request-id"] == r.json()["id"]  # generated ids are echoed too
    r = httpx.post(f"{url}/v1/completions", headers={"X-Request-Id": "bad-1"},
                   json={"prompt": "hi", "max_tokens": "1"})
    assert r.status_code == 400 and r.headers["x-request-id"] == "bad-1"  # errors too


def test_duplicate_request_id_in_flight_is_400_then_reusable(server):
    url = server.base_url

    async def main() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            # 8 prompts x 1000 tokens, one sequence at a time: in flight for seconds
            body = {"prompt": [[5, 6]] * 8, "max_tokens": 1000, "ignore_eos": True,
                    "stream": True, "request_id": "same"}
            async with c.stream("POST", "/v1/completions", json=body) as first:
                lines = first.aiter_lines()  # kept: a dropped iterator closes the stream
                await anext(lines)
                r = await c.post("/v1/completions", json={**body, "stream": False})
                assert r.status_code == 400, r.text
                assert r.json()["error"]["param"] == "request_id"
                assert "already in use" in r.json()["error"]["message"]
            wait_idle(url)
            r = await c.post("/v1/completions", json={**body, "stream": False,
                                                      "max_tokens": 2})
            assert r.status_code == 200 and r.json()["id"] == "cmpl-same"

    asyncio.run(main())


def test_return_token_ids_completions_and_chat(server):
    url = server.base_url
    prompt_ids = httpx.post(f"{url}/tokenize", json={"prompt": "hello there"}).json()["tokens"]
    r = httpx.post(f"{url}/v1/completions", json={
        "prompt": "hello there", "max_tokens": 5, "ignore_eos": True, "temperature": 0,
        "return_token_ids": True}).json()
    choice = r["choices"][0]
    assert choice["prompt_token_ids"] == prompt_ids
    assert len(choice["token_ids"]) == 5 == r["usage"]["completion_tokens"]
    assert httpx.post(f"{url}/detokenize", json={"tokens": choice["token_ids"]}).json()[
        "prompt"] == choice["text"]
    plain = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 1}).json()
    assert "token_ids" not in plain["choices"][0]  # only when asked for
    events = parse_sse(httpx.post(f"{url}/v1/completions", json={
        "prompt": "hello there", "max_tokens": 5, "ignore_eos": True, "temperature": 0,
        "return_token_ids": True, "stream": True}).text)[:-1]
    assert events[0]["choices"][0]["prompt_token_ids"] == prompt_ids
    assert [t for e in events for c in e["choices"] for t in c["token_ids"]] == \
        choice["token_ids"]
    chat = httpx.post(f"{url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True,
        "return_token_ids": True}).json()
    assert chat["prompt_token_ids"] and len(chat["prompt_token_ids"]) == \
        chat["usage"]["prompt_tokens"]
    assert len(chat["choices"][0]["token_ids"]) == 3


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats_in_every_chunk(server, path):
    body = {"max_tokens": 6, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    body.update({"prompt": "count"} if "chat" not in path else
                {"messages": [{"role": "user", "content": "count"}]})
    events = parse_sse(httpx.post(f"{server.base_url}{path}", json=body, timeout=60).text)
    assert events[-1] == "[DONE]"
    usages = [e["usage"] for e in events[:-1]]
    assert all(u is not None for u in usages)
    done = [u["completion_tokens"] for u in usages]
    assert done == sorted(done) and done[-1] == 6
    assert len({u["prompt_tokens"] for u in usages}) == 1
