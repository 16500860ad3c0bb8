"""Prompt lookup (n-gram) proposals: copy what followed the last occurrence of the context's
suffix.

    tokens:  a b c d e ... x b c d      suffix "b c d" (n = 3) occurred at 1..3
                 ^^^^^ ^^^^^^
                 match  proposal = tokens[4 : 4 + k] = "e ..."

Tries n = prompt_lookup_max down to prompt_lookup_min and takes the most recent earlier
occurrence of the longest suffix that has one (and k tokens after it, when one has). No model, no state: a function of the tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pagedllm.speculative.proposer import Proposer

if TYPE_CHECKING:
    from pagedllm.config import EngineConfig
    from pagedllm.config.speculative import SpeculativeConfig
    from pagedllm.core.block_manager import BlockManager
    from pagedllm.core.request import Request


class NgramProposer(Proposer):
    def __init__(self, config: SpeculativeConfig, engine_config: EngineConfig | None = None,
                 vocab_size: int = 0) -> None:
        self.min_n, self.max_n = config.prompt_lookup_min, config.prompt_lookup_max

    def propose(self, requests: list[Request], ks: list[int], bm: BlockManager
                ) -> list[list[int]]:
        return [self.propose_tokens(req.all_token_ids, k)
                for req, k in zip(requests, ks, strict=True)]

    def propose_tokens(self, token_ids: list[int], k: int) -> list[int]:
        """Up to `k` tokens continuing `token_ids` ([] when no suffix recurs)."""
        n_tok = len(token_ids)
        if k <= 0 or n_tok < self.min_n + 1:
            return []
        tokens = np.asarray(token_ids, dtype=np.int64)
        for n in range(min(self.max_n, n_tok - 1), self.min_n - 1, -1):
            # Windows starting at 0 .. n_tok - n - 1 (the suffix itself excluded).
            windows = sliding_window_view(tokens[:-1], n)
            hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
            if hits.size:
                # The most recent occurrence with k tokens after it, else the oldest one
                # (a run like "a a a a" would otherwise propose a single token).
                full = hits[hits + n + k <= n_tok]
                start = int(full[-1] if full.size else hits[0]) + n
                return token_ids[start:start + k]
        return []
