"""Slow and vanishing clients: a stalled reader must not slow the engine or other streams, and a
client that disconnects (streaming or not) has its request aborted and its blocks freed."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_harness import TINY_SERVER_ARGS, parse_sse, scrape, start_server, wait_idle

LONG = 700  # tokens of a "long" request (~0.5-3 s of tiny-model decoding)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path, TINY_SERVER_ARGS)
    yield srv
    srv.stop()


def _stream_completion(base_url: str, max_tokens: int = 48) -> str:
    body = {"prompt": "Streams in parallel", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=60) as r:
        events = parse_sse(r.read().decode())
    assert events[-1] == "[DONE]"
    return "".join(c["text"] for e in events[:-1] for c in e["choices"])


def _run_streams(base_url: str, k: int = 4) -> float:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(k) as pool:
        texts = list(pool.map(lambda _: _stream_completion(base_url), range(k)))
    assert len(set(texts)) == 1
    return time.perf_counter() - t0


def _raw_request(port: int, body: dict, rcvbuf: int | None = None) -> socket.socket:
    """POST /v1/completions on a bare socket (optionally with a tiny receive buffer, so that
    not reading soon pushes back on the server)."""
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    payload = json.dumps(body).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nConnection: close\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(payload), payload))
    return sock


def _read_chunked(sock: socket.socket) -> str:
    data = b""
    sock.settimeout(30)
    while chunk := sock.recv(1 << 16):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    out = b""
    while True:  # Transfer-Encoding: chunked
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return out.decode()
        out, body = out + body[:size], body[size + 2:]


def _counter(m: dict, reason: str) -> float:
    return m.get(f'pagedllm:request_success_total{{finished_reason="{reason}"}}', 0.0)


def test_stalled_reader_does_not_slow_others(server):
    _run_streams(server.base_url)  # warm-up
    baseline = _run_streams(server.base_url)
    gen0 = scrape(server.base_url)["pagedllm:generation_tokens_total"]
    body = {"prompt": "I will never read this", "max_tokens": LONG, "temperature": 0,
            "ignore_eos": True, "stream": True, "logprobs": 20}
    stalled = _raw_request(server.port, body, rcvbuf=4096)
    try:
        with_stalled = _run_streams(server.base_url)
        assert with_stalled < 2 * baseline + 1.0, (baseline, with_stalled)
        # The engine finishes the stalled request without anyone reading it; the stream holds
        # its output (coalesced) and the blocks are already free.
        m = wait_idle(server.base_url, timeout=30)
        assert m["pagedllm:kv_cache_usage_perc"] == 0 and m["pagedllm:num_requests_running"] == 0
        assert m["pagedllm:generation_tokens_total"] - gen0 >= LONG + 4 * 48
        events = parse_sse(_read_chunked(stalled))
    finally:
        stalled.close()
    assert events[-1] == "[DONE]"
    chunks = [c for e in events[:-1] for c in e["choices"]]
    assert sum(len(c["logprobs"]["tokens"]) for c in chunks) == LONG
    assert chunks[-1]["finish_reason"] == "length"
    assert len(chunks) < LONG, "a reader that fell behind gets coalesced chunks"


def test_disconnect_mid_stream_aborts_and_frees_blocks(server):
    before = wait_idle(server.base_url)
    body = {"prompt": "Disconnect soon", "max_tokens": LONG, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(3)]
        assert got[0].startswith("data: ")
        assert scrape(server.base_url)["pagedllm:kv_cache_usage_perc"] > 0
    after = wait_idle(server.base_url)
    assert after["pagedllm:kv_cache_usage_perc"] == 0
    assert after["pagedllm:num_requests_running"] == 0
    assert _counter(after, "abort") == _counter(before, "abort") + 1
    assert _counter(after, "length") == _counter(before, "length")


def test_disconnect_non_streaming_aborts(server):
    before = wait_idle(server.base_url)
    body = {"prompt": "Wait for me", "max_tokens": LONG, "temperature": 0, "ignore_eos": True}
    sock = _raw_request(server.port, body)
    try:  # hang up as soon as the engine runs the request (no timing guess about its speed)
        deadline = time.monotonic() + 10
        while scrape(server.base_url)["pagedllm:num_requests_running"] == 0:
            assert time.monotonic() < deadline, "the request never started"
    finally:
        sock.close()
    after = wait_idle(server.base_url)
    assert after["pagedllm:kv_cache_usage_perc"] == 0
    assert _counter(after, "abort") == _counter(before, "abort") + 1
    assert _counter(after, "length") == _counter(before, "length")
