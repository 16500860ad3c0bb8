"""Helpers for the server tests: a real `pagedllm serve` process, /metrics scraping, SSE parsing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from pagedllm.entrypoints.launcher import free_port, wait_for_health

# Tiny model, small KV pool (so kv usage is visible), one torch thread (2-core CI).
TINY_SERVER_ARGS = ["--kv-cache-memory", "4MiB", "--max-model-len", "1024", "--num-threads", "1",
                    "--disable-access-log"]


class ServerProcess:
    """`python -m pagedllm.entrypoints.cli serve MODEL --port P ...`, logging to a file."""

    def __init__(self, model: str | None, args: list[str], log_path: Path,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve",
               *([model] if model else []), "--port", str(self.port), *args]
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})

    def wait_ready(self, timeout: float = 120.0) -> ServerProcess:
        try:
            wait_for_health(self.proc, self.base_url, timeout, self.log)
        except TimeoutError:
            self.stop()
            raise
        return self

    def log(self) -> str:
        return self.log_path.read_text()

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.terminate(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def start_server(tmp_path_factory, model: str | None, args: list[str],
                 env: dict[str, str] | None = None, name: str = "server") -> ServerProcess:
    log = tmp_path_factory.mktemp(name) / "server.log"
    return ServerProcess(model, args, log, env).wait_ready()


# --------------------------------------------------------------- metrics
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def scrape(base_url: str) -> dict[str, float]:
    """GET /metrics -> {"name{label=...}" or "name": value} (model_name label dropped)."""
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    out = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = re.sub(r'model_name="[^"]*",?', "", m.group(2) or "").replace("{}", "")
        out[m.group(1) + labels] = float(m.group(3))
    return out


def wait_idle(base_url: str, timeout: float = 10.0) -> dict[str, float]:
    """Poll /metrics until nothing runs or waits and the KV cache is empty."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(base_url)
        idle = (m["pagedllm:num_requests_running"] == 0
                and m["pagedllm:num_requests_waiting"] == 0
                and m["pagedllm:kv_cache_usage_perc"] == 0)
        if idle or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


# ------------------------------------------------------------------- SSE
def parse_sse(raw: str) -> list[dict | str]:
    """`data: {...}\\n\\n` events -> parsed JSON (or the literal "[DONE]")."""
    events: list[dict | str] = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events
