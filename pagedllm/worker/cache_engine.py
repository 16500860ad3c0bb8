"""The KV pool tensors: one preallocated tensor for all layers, K and V.

Layout `[layers, 2, num_blocks, block_size, kv_heads, head_dim]`; layer l's K pool is
`kv[l, 0]` (`num_blocks x block_size x kv_heads x head_dim`). Zero-initialised so that padded
(masked) slots read by batched attention are finite. Block copies for copy-on-write run as one
indexed copy across all layers.
"""

from __future__ import annotations

import logging

import torch

from pagedllm.config import KVCacheSpec

logger = logging.getLogger(__name__)


class CacheEngine:
    def __init__(self, spec: KVCacheSpec, num_blocks: int, device: torch.device) -> None:
        self.spec = spec
        self.num_blocks = num_blocks
        self.kv = torch.zeros(spec.num_layers, 2, num_blocks, spec.block_size,
                              spec.num_kv_heads, spec.head_dim, dtype=spec.dtype, device=device)
        self.layer_caches = [(self.kv[i, 0], self.kv[i, 1]) for i in range(spec.num_layers)]

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks src -> dst in every layer (one batched op)."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.kv.device)
        dst = torch.tensor([d for _, d in copies], device=self.kv.device)
        self.kv[:, :, dst] = self.kv[:, :, src]
