"""Slow and idle connections (issue #28) against a real server with short limits: a silent
connection, headers trickled a line at a time, a chunked body that never ends, a
Content-Length larger than what is sent and an idle keep-alive connection are all closed
within their timeouts, and --limit-concurrency turns connections past the cap away with 503.
A few raw sockets each, bounded by socket timeouts.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from server_harness import TINY_SERVER_ARGS, start_server

LIMIT = 1.0  # each timeout below, in seconds
ARGS = [*TINY_SERVER_ARGS, "--timeout-request-header", str(LIMIT), "--timeout-request-body",
        str(LIMIT), "--timeout-keep-alive", str(LIMIT), "--limit-concurrency", "6"]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path, ARGS, name="slow-clients")
    yield srv
    srv.stop()


def connect(srv) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    return sock


def read_until_closed(sock: socket.socket, budget: float = 10.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes: (bytes, seconds it took)."""
    t0, data = time.monotonic(), b""
    sock.settimeout(budget)
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data, time.monotonic() - t0
        data += chunk


def test_silent_connection_is_closed(server):
    with connect(server) as sock:
        data, took = read_until_closed(sock)
    assert data == b"" and took < LIMIT + 2


def test_trickled_headers_are_cut_off(server):
    with connect(server) as sock:
        t0 = time.monotonic()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed = False
        for i in range(20):  # a header line every 0.3 s: data keeps arriving, never complete
            time.sleep(0.3)
            try:
                sock.sendall(f"X-Slow-{i}: {i}\r\n".encode())
            except OSError:
                closed = True
                break
        if not closed:
            data, _ = read_until_closed(sock)
            assert data == b""
        assert time.monotonic() - t0 < LIMIT + 3


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_body_that_stops_arriving_gets_408(server, framing):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n")
    if framing == "chunked":
        head += b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"pro\r\n"
    else:
        head += b"Content-Length: 1000\r\n\r\n{\"prompt\": "
    with connect(server) as sock:
        sock.sendall(head)
        data, took = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"--timeout-request-body" in data
    assert took < LIMIT + 3


def test_idle_keep_alive_connection_is_closed(server):
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data, took = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200") and took < LIMIT + 2


def test_connections_past_the_cap_get_503(server):
    idle = [connect(server) for _ in range(6)]
    try:
        time.sleep(0.2)
        r = httpx.get(f"{server.base_url}/health", timeout=10)
        assert r.status_code == 503
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.base_url}/health", timeout=10).status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)
