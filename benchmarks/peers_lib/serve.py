"""Serving peers: start a server process, wait for /health, load it with the client of
`benchmarks/serving.py` (streaming /v1/completions, token-id prompts, ignore_eos), stop it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time

from benchmarks import serving as client

logger = logging.getLogger("benchmarks.peers")


def pagedllm_command(model: str | None, port: int, threads: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve", *([model] if model else []),
            "--port", str(port), "--num-threads", str(threads), "--disable-access-log", *extra]


_DISCONNECT = "Server disconnected without sending a response"


@contextlib.contextmanager
def retry_disconnects(counter: list[int]):
    """Resend a request whose keep-alive connection the server closed before answering.

    llama-server sometimes closes a connection right after a streamed response; the client's
    next request on it then fails at once, before the server saw it. Such a request is sent
    again on a fresh connection and the time lost is added to its TTFT and E2E.
    """
    original = client.one_request

    async def one_request(*args, **kwargs):
        t0 = time.perf_counter()
        resent = 0
        while True:
            res = await original(*args, **kwargs)
            if res.ok or _DISCONNECT not in res.error or resent == 2:
                break
            resent += 1
        counter[0] += resent
        lost = time.perf_counter() - t0 - res.e2e
        if resent and res.ok and lost > 0:
            res.ttft += lost
            res.e2e += lost
        return res

    client.one_request = one_request
    try:
        yield
    finally:
        client.one_request = original


def load(base_url: str, *, concurrency: int, num_prompts: int, input_len: int,
         output_len: int, seed: int = 0, input_len_max: int | None = None) -> dict:
    """One `benchmarks/serving.py` run at a fixed concurrency (all requests queued at once);
    `input_len_max`: prompt lengths long-tailed between input_len and it."""
    args = argparse.Namespace(
        api_key=None, model=None, num_prompts=num_prompts, input_len=input_len,
        input_len_max=input_len_max, output_len=output_len, max_concurrency=concurrency, request_rate=float("inf"),
        vocab_size=32000, token_id_low=100, warmup=1, seed=seed)
    resent = [0]
    with retry_disconnects(resent):
        res = asyncio.run(client.run_one(base_url, args))
    res["concurrency"] = concurrency
    res["resent_after_disconnect"] = resent[0]
    if res["failed"]:
        logger.warning("%s at concurrency %d: %d requests failed: %s", base_url, concurrency,
                       res["failed"], res["errors"])
    return res
