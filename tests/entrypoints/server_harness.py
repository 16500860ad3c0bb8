"""Helpers for the server tests: a real `pagedllm serve` process, /metrics scraping, SSE parsing."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pagedllm.entrypoints.launcher import ServerProcess, free_port

# Tiny model, small KV pool (so kv usage is visible), one torch thread (2-core CI).
TINY_SERVER_ARGS = ["--kv-cache-memory", "4MiB", "--max-model-len", "1024", "--num-threads", "1",
                    "--disable-access-log"]


def pagedllm_server(model: str | None, args: list[str], log_path: Path,
                    env: dict[str, str] | None = None) -> ServerProcess:
    """`python -m pagedllm.entrypoints.cli serve MODEL --port P ...` on a free port (with
    $PAGEDLLM_TEST_FAULTS in `env`: the same CLI under tests/fault_injection.py's wrappers)."""
    port = free_port()
    entry = (["-m", "pagedllm.entrypoints.cli"] if "PAGEDLLM_TEST_FAULTS" not in (env or {})
             else [str(Path(__file__).parents[1] / "fault_injection.py")])
    if "PAGEDLLM_TEST_FAULTS" in (env or {}):
        # The script's folder (tests/), not the checkout, heads its sys.path: name the
        # checkout so that pagedllm imports without an (editable) install.
        root = str(Path(__file__).parents[2])
        env = {**env, "PYTHONPATH": os.pathsep.join(
            p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, *entry, "serve", *([model] if model else []), "--port", str(port),
           *args]
    return ServerProcess(cmd, port, log_path, env)


def start_server(tmp_path_factory, model: str | None, args: list[str],
                 env: dict[str, str] | None = None, name: str = "server") -> ServerProcess:
    log = tmp_path_factory.mktemp(name) / "server.log"
    return pagedllm_server(model, args, log, env).wait_ready()


# --------------------------------------------------------------- metrics
def scrape(base_url: str) -> dict[str, float]:
    """GET /metrics -> {"name{label=...}" or "name": value} (model_name label dropped),
    parsed with prometheus_client's parser."""
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items() if k != "model_name")
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
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
