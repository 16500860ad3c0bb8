"""Start-up helpers for a server run as a child process (tests, benchmarks, scripts)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

import httpx


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_health(proc: subprocess.Popen, base_url: str, timeout: float,
                    log_tail: Callable[[], str], name: str = "server") -> None:
    """Poll `base_url`/health until it answers 200.

    Raises RuntimeError (with the log tail) if the process exits first, TimeoutError if it is
    not ready within `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log_tail()}")
        try:
            if httpx.get(f"{base_url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{name} not ready after {timeout:.0f} s:\n{log_tail()}")
