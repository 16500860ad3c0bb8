"""A server run as a child process (tests, benchmarks, scripts): start it with its output in a
log file, wait for /health, stop it with SIGTERM (then SIGKILL)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx

logger = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`cmd` serving on 127.0.0.1:`port`, stdout and stderr to `log_path`; a context manager
    that stops it."""

    def __init__(self, cmd: list[str], port: int, log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.cmd, self.port, self.log_path = cmd, port, log_path
        self.base_url = f"http://127.0.0.1:{port}"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        logger.info("$ %s", " ".join(cmd))
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in terminate() / stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})

    def wait_ready(self, timeout: float = 120.0) -> ServerProcess:
        """Poll /health until it answers 200. Raises RuntimeError (with the log tail) if the
        process exits first, TimeoutError (after stopping it) if it is not ready in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.cmd[0]} exited with {self.proc.returncode}:\n"
                                   f"{self.log_tail()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"{self.cmd[0]} not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_tail(self, n: int = 3000) -> str:
        return self.log()[-n:]

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; returns the exit status (TimeoutExpired if it does not exit)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM, and SIGKILL if it has not exited after `timeout` seconds."""
        try:
            self.terminate(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
