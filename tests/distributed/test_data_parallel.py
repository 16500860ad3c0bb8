"""`pagedllm serve --data-parallel-size 2`: one API server, two replica processes. Both get
requests; requests sharing a prefix land on one replica; a replica killed mid-request fails
its request while the other keeps serving."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.entrypoints.server_harness import TINY_SERVER_ARGS, scrape, start_server

PREFIX = list(range(100, 140))  # 40 tokens: two full blocks of 16


@pytest.fixture(scope="module")
def dp_server(tmp_path_factory, tiny_llama_dir):
    server = start_server(tmp_path_factory, str(tiny_llama_dir),
                          [*TINY_SERVER_ARGS, "--data-parallel-size", "2",
                           "--generation-config", "vllm", "--served-model-name", "m"], name="dp")
    yield server
    server.stop()


def _routed(base_url: str) -> list[float]:
    m = scrape(base_url)
    return [m[f'pagedllm:dp_requests_routed_total{{replica="{i}"}}'] for i in range(2)]


def _complete(base_url: str, prompt: list[int], max_tokens: int = 4) -> dict:
    r = httpx.post(f"{base_url}/v1/completions", timeout=60, json={
        "model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def _pids(log: str) -> list[int]:
    found = dict(re.findall(r"data-parallel replica (\d) ready \(pid (\d+)", log))
    return [int(found[str(i)]) for i in range(2)]


def test_both_replicas_serve_and_prefixes_stick(dp_server):
    url = dp_server.base_url
    before = _routed(url)
    for i in range(4):  # shorter than a block: least loaded, turns on ties
        _complete(url, [5 + i, 6, 7])
    mid = _routed(url)
    assert all(mid[i] - before[i] >= 1 for i in range(2)), (before, mid)
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda i: _complete(url, PREFIX + [200 + i]), range(6)))
    assert all(o["choices"][0]["text"] is not None for o in outs)
    after = _routed(url)
    gained = sorted(after[i] - mid[i] for i in range(2))
    assert gained == [0, 6], (mid, after)


def test_killed_replica_fails_its_request_and_the_other_serves(dp_server):
    url = dp_server.base_url
    _complete(url, PREFIX + [7])  # make sure the prefix has an owner
    before = _routed(url)
    events: list[dict | str] = []
    started = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", timeout=120, json={
                "model": "m", "prompt": PREFIX + [9], "max_tokens": 900, "temperature": 0,
                "ignore_eos": True, "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data = line[len("data: "):]
                    events.append(data if data == "[DONE]" else json.loads(data))
                    started.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert started.wait(60)
    now = _routed(url)
    victim = next(i for i in range(2) if now[i] > before[i])  # the prefix's replica
    os.kill(_pids(dp_server.log())[victim], signal.SIGKILL)
    thread.join(120)
    assert not thread.is_alive()
    assert any(isinstance(e, dict) and "error" in e for e in events), events[-3:]
    assert not any(isinstance(e, dict) and e.get("choices")
                   and e["choices"][0].get("finish_reason") == "length" for e in events)
    deadline = time.monotonic() + 30
    while scrape(url)[f'pagedllm:dp_replica_alive{{replica="{victim}"}}'] != 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    for i in range(3):  # the prefix, and anything else, now goes to the survivor
        _complete(url, PREFIX + [300 + i])
    final = _routed(url)
    assert final[1 - victim] - now[1 - victim] == 3
