"""Start-up progress: each load step logged with its time, and the warm-up forward pass.

A first start compiles the CPU kernels and converts the GGUF file (minutes); later starts read
both from their caches (seconds). Either way the log says which step runs and how long it took:

    start-up: CPU kernels 0.05 s
    start-up: checkpoint (config, tokenizer) 1.62 s
    start-up: weights 0.41 s
    start-up: KV pool 2.00 GiB 0.55 s
    start-up: warm-up forward pass 0.20 s
    start-up: engine ready in 3.10 s
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger(__name__)

WARMUP_REQUEST_ID = "pagedllm-warmup"
# A salt of its own: the warm-up's KV blocks are never matched by a user's prompt.
_WARMUP_SALT = "pagedllm-warmup"


@contextmanager
def step(what: str) -> Iterator[None]:
    """Log `what` with the seconds the block took (also when it raises, to show where)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        logger.info("start-up: %s %.2f s", what, time.perf_counter() - t0)


def warm_up(engine) -> None:
    """One short request through the whole step (prefill, a decode, sampling), so the first
    user request does not pay for first-call costs (kernel loads, allocator growth, thread
    pools). The engine's counters are reset afterwards: metrics start at zero."""
    from pagedllm.pooling_params import PoolingParams
    from pagedllm.sampling_params import SamplingParams

    token = engine.eos_token_id if engine.eos_token_id is not None else 0
    n = max(1, min(4, engine.config.block_size - 1))
    pooling = getattr(engine, "pooling", None)  # a pooling model: one prefill, pooled
    params = (PoolingParams(task="encode") if pooling is not None
              else SamplingParams(max_tokens=2, ignore_eos=True))
    with step("warm-up forward pass"):
        engine.add_request([token] * n, params, request_id=WARMUP_REQUEST_ID,
                           cache_salt=_WARMUP_SALT)
        while engine.has_unfinished_requests():
            engine.step()
    engine.reset_stats()
