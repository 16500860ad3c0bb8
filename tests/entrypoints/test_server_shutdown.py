"""Graceful shutdown (issue #28), against a real server process: on SIGTERM new requests and
/health get 503 + Retry-After while in-flight requests finish (up to --shutdown-timeout), then
whatever is left ends with an error event; the process exits 0; a second signal exits at once.
"""

from __future__ import annotations

import contextlib
import signal
import time

import httpx
import pytest
from server_harness import TINY_SERVER_ARGS, parse_sse, start_server

# One sequence at a time and 4 prompts x 1000 tokens: in flight for seconds on any machine.
ARGS = [*TINY_SERVER_ARGS, "--max-num-seqs", "1"]
LONG = {"prompt": [[5, 6], [7, 8], [9, 10], [11, 12]], "max_tokens": 1000, "ignore_eos": True,
        "stream": True}


def _stream_then(srv, action) -> tuple[list, float]:
    """Start LONG, run `action()` after its first chunk, read the rest: (events, seconds)."""
    with httpx.stream("POST", f"{srv.base_url}/v1/completions", json=LONG, timeout=120) as r:
        lines = r.iter_lines()
        first = next(lines)
        t0 = time.monotonic()
        action()
        events = parse_sse("".join(f"{line}\n\n" for line in [first, *lines] if line))
    return events, t0


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests_and_refuses_new_ones(tmp_path_factory,
                                                                tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path,
                       [*ARGS, "--shutdown-timeout", "120"], name="drain")
    refused = {}

    def sigterm_then_probe() -> None:
        srv.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        r = httpx.post(f"{srv.base_url}/v1/completions", json={"prompt": "x"}, timeout=10)
        refused["new"] = (r.status_code, r.headers.get("retry-after"), r.json()["error"])
        refused["health"] = httpx.get(f"{srv.base_url}/health", timeout=10).status_code
        refused["metrics"] = httpx.get(f"{srv.base_url}/metrics", timeout=10).status_code

    try:
        events, _ = _stream_then(srv, sigterm_then_probe)
        status, retry_after, err = refused["new"]
        assert status == 503 and int(retry_after) >= 1 and err["type"] == "service_unavailable"
        assert refused["health"] == 503 and refused["metrics"] == 200
        assert events[-1] == "[DONE]"
        finishes = [c["finish_reason"] for e in events[:-1] for c in e["choices"]
                    if c["finish_reason"] is not None]
        assert finishes == ["length"] * 4  # every in-flight prompt ran to its end
        assert srv.proc.wait(timeout=60) == 0  # by itself, once nothing was in flight
        assert "Traceback" not in srv.log()
    finally:
        srv.stop()


def test_shutdown_timeout_ends_the_rest_with_an_error_event(tmp_path_factory,
                                                            tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path,
                       [*ARGS, "--shutdown-timeout", "0.5"], name="drain-timeout")
    try:
        events, t0 = _stream_then(srv, lambda: srv.proc.send_signal(signal.SIGTERM))
        assert events[-1] == "[DONE]"
        assert events[-2]["error"]["type"] == "service_unavailable"
        assert "abort" not in {c["finish_reason"] for e in events[:-2] for c in e["choices"]}
        assert srv.proc.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 15
    finally:
        srv.stop()


def test_second_signal_exits_at_once(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path,
                       [*ARGS, "--shutdown-timeout", "300"], name="drain-twice")
    try:
        def twice() -> None:
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            srv.proc.send_signal(signal.SIGINT)

        t0 = time.monotonic()
        with contextlib.suppress(httpx.HTTPError):  # the connection may just close
            _stream_then(srv, twice)
        assert srv.proc.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 15  # not the 300 s drain
    finally:
        srv.stop()
