"""`Proposer`: what a speculative-decoding method implements (one class per method).

The `Speculator` owns one proposer, chosen by `SpeculativeConfig.method` from `PROPOSERS`
(speculative/registry.py). After each step's result is applied it hands the proposer the
decoding requests and how many tokens each may draft; the proposer returns the drafts.
A proposer with a model of its own (the draft model) also says so here: its KV bytes per
block (the engine splits the KV budget), its pool allocation, and `mirror`, which the
model runner calls after every target forward pass to keep that model's KV current.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedllm.config import EngineConfig, KVCacheSpec
    from pagedllm.config.speculative import SpeculativeConfig
    from pagedllm.core.block_manager import BlockManager
    from pagedllm.core.request import Request


class Proposer(ABC):
    """Drafts for decoding requests. Constructed as `cls(config, engine_config, vocab_size)`."""

    # The KV layout of the proposer's own model, held in the target's block ids (None: none).
    kv_spec: KVCacheSpec | None = None
    # The model runner calls `mirror(batch, copies)` after each target forward pass.
    mirrors_target: bool = False
    # Whether a request with n > 1 samples may draft (forked siblings share a partial block:
    # a proposer writing KV into it would race them).
    drafts_forked_requests: bool = True

    @abstractmethod
    def __init__(self, config: SpeculativeConfig, engine_config: EngineConfig,
                 vocab_size: int) -> None: ...

    @abstractmethod
    def propose(self, requests: list[Request], ks: list[int], bm: BlockManager
                ) -> list[list[int]]:
        """Up to ks[i] draft tokens for requests[i] (fewer, or none, is always allowed)."""

    def allocate(self, num_blocks: int) -> None:
        """Allocate the proposer's own KV pool of `num_blocks` blocks (if it has one)."""
        return None  # no model of its own, no pool
