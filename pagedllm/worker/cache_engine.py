"""The KV pool tensors: one preallocated tensor for all layers, K and V (plus their scales
when the cache is int8 / fp8).

Layout `[layers_per_block, parts, num_blocks, block_size, kv_heads, head_dim]` (parts: K and V,
or one latent row for multi-head latent attention, whose V is K's pool); layer l's K pool
is `kv[s, 0]` (`num_blocks x block_size x kv_heads x head_dim`) for its slot s in its KV group
(core/kv_groups.py: one group of every layer, s = l, unless sliding-window layers keep
tables of their own; then the layers of different groups share slots, at different blocks). A quantized cache adds
`scales [layers, 2, num_blocks, block_size, kv_heads]` (float16, one per token per KV head;
see model/layers/kv_quant.py). Both are indexed by the same block ids, and every operation
that moves blocks goes through `pools`, so scales always travel with their values.
Zero-initialised so that padded (masked) slots read by batched attention are finite. Block
copies for copy-on-write run as one indexed copy per pool across all layers.

Swap space (preemption mode "swap"): `num_swap_blocks` more blocks of the same layout in
host memory (pinned when the device is CUDA), with their own block ids, kept separate from
the device pool even on a CPU-only machine. `swap_blocks_out` / `swap_blocks_in` move a
step's blocks in one batched gather + scatter per pool (values and scales together).
"""

from __future__ import annotations

import logging
import math

import torch

from pagedllm.config import KVCacheSpec
from pagedllm.model.layers import kv_quant
from pagedllm.model.layers.attention import LayerKVCache
from pagedllm.worker.anonymous_memory import anonymous_bytes

logger = logging.getLogger(__name__)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor. On CPU it is an anonymous private mapping, whose pages the OS hands out
    already zeroed when first written, so a multi-GiB pool costs no start-up time
    (torch.zeros writes every byte) and RAM is committed as blocks are used.

    Its pages are 4 KiB, not transparent huge pages (MADV_NOHUGEPAGE): one layer's part of a
    block is a few KiB, so the first write of a 512-token prompt touches 2 x layers separate
    2 MiB regions, and each huge page zeroed (and, on a fragmented host, compacted) on first
    touch cost that prefill 150-1,000 ms on SmolLM2 (numpy.zeros, the allocation before,
    asks for huge pages on Linux) against ~10 ms for the same writes on 4 KiB pages."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(shape) * itemsize
    if (raw := anonymous_bytes(nbytes, "MADV_NOHUGEPAGE")) is None:
        return torch.zeros(shape, dtype=dtype)
    return raw.view(dtype).view(shape)


class CacheEngine:
    def __init__(self, spec: KVCacheSpec, num_blocks: int, device: torch.device,
                 num_swap_blocks: int = 0) -> None:
        self.spec = spec
        self.num_blocks = num_blocks
        self.num_swap_blocks = num_swap_blocks
        shape = (spec.layers_per_block, spec.parts, num_blocks, spec.block_size,
                 spec.num_kv_heads)
        self.kv = _zeros((*shape, spec.head_dim), spec.dtype, device)
        self.scales = _zeros(shape, kv_quant.SCALE_DTYPE, device) if spec.quantized else None
        # Same layout as `pools` with num_swap_blocks on dim 2. A block is never read before a
        # swap-out writes it, so `empty` (which, unpinned, commits no RAM up front) is enough.
        self.swap_pools = [
            torch.empty((*p.shape[:2], num_swap_blocks, *p.shape[3:]), dtype=p.dtype,
                        device="cpu", pin_memory=device.type == "cuda")
            for p in self.pools] if num_swap_blocks else []
        s = self.scales
        self.layer_caches = []
        for layer in range(spec.num_layers):
            group, i = spec.groups.slot_of(layer)
            v = spec.parts - 1  # a latent cache (one part): V is read from K's rows
            self.layer_caches.append(LayerKVCache(
                self.kv[i, 0], self.kv[i, v], None if s is None else s[i, 0],
                None if s is None else s[i, v], group))

    @property
    def pools(self) -> list[torch.Tensor]:
        """Every tensor indexed by block id on dim 2 (values, then scales if quantized)."""
        return [self.kv] if self.scales is None else [self.kv, self.scales]

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks src -> dst in every layer (one batched op per pool)."""
        if not copies:
            return
        src = torch.tensor([s for s, _ in copies], device=self.kv.device)
        dst = torch.tensor([d for _, d in copies], device=self.kv.device)
        for pool in self.pools:
            p = kv_quant.raw(pool)
            p[:, :, dst] = p[:, :, src]

    def swap_out(self, block_ids: list[int], device: torch.device | str = "cpu"
                 ) -> list[torch.Tensor]:
        """Copies of the blocks' contents (all layers, values and scales) on `device`."""
        idx = torch.tensor(block_ids, device=self.kv.device)
        return [kv_quant.raw(pool)[:, :, idx].to(device).view(pool.dtype) for pool in self.pools]

    def swap_in(self, block_ids: list[int], saved: list[torch.Tensor]) -> None:
        """Write what `swap_out` returned into the blocks `block_ids` (any free blocks)."""
        if len(saved) != len(self.pools):
            raise ValueError(f"expected {len(self.pools)} saved pools, got {len(saved)}")
        idx = torch.tensor(block_ids, device=self.kv.device)
        for pool, data in zip(self.pools, saved, strict=True):
            kv_quant.raw(pool)[:, :, idx] = kv_quant.raw(data).to(pool.device)

    def swap_blocks_out(self, pairs: list[tuple[int, int]]) -> None:
        """Copy device blocks into swap blocks: (device block, swap block) pairs."""
        if not pairs:
            return
        saved = self.swap_out([d for d, _ in pairs], "cpu")
        idx = torch.tensor([c for _, c in pairs])
        for swap_pool, data in zip(self.swap_pools, saved, strict=True):
            kv_quant.raw(swap_pool)[:, :, idx] = kv_quant.raw(data)

    def swap_blocks_in(self, pairs: list[tuple[int, int]]) -> None:
        """Copy swap blocks into device blocks: (swap block, device block) pairs."""
        if not pairs:
            return
        idx = torch.tensor([c for c, _ in pairs])
        saved = [kv_quant.raw(p)[:, :, idx].view(p.dtype) for p in self.swap_pools]
        self.swap_in([d for _, d in pairs], saved)
