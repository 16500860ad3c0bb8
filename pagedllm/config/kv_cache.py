"""The paged KV cache's shape and the arithmetic users plan with (bytes per token, blocks)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedllm.core.kv_groups import KVGroupLayout
from pagedllm.model.layers import kv_quant


@dataclass(frozen=True)
class KVCacheSpec:
    """Shape of the paged KV cache and the arithmetic users plan with.

    `dtype` is the storage dtype of K/V: the model dtype, or int8 / fp8, which also store a
    scale per token per KV head. `layout` splits the layers into KV groups (full attention,
    sliding window: core/kv_groups.py); a block holds `layers_per_block` layers of one group.
    None: one group of every layer, no block ever freed before its sequence ends.
    `parts`: 2 (K and V), or 1 for a latent cache (multi-head latent attention: one row per
    token whose leading values the layer reads as V; model/layers/mla.py).
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int
    layout: KVGroupLayout | None = None
    parts: int = 2

    def __post_init__(self) -> None:
        if self.parts not in (1, 2):
            raise ValueError(f"a KV cache holds 2 parts (K, V) or 1 (a latent cache); "
                             f"got {self.parts}")
        if self.layout is not None and self.layout.num_layers != self.num_layers:
            raise ValueError(f"the KV layout covers {self.layout.num_layers} layers, the model "
                             f"has {self.num_layers}")

    @property
    def quantized(self) -> bool:
        return kv_quant.is_quantized(self.dtype)

    @property
    def dtype_bytes(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def scale_bytes(self) -> int:
        """Bytes of the scale stored with each head_dim row (0 when not quantized)."""
        if not self.quantized:
            return 0
        return torch.empty((), dtype=kv_quant.SCALE_DTYPE).element_size()

    @property
    def groups(self) -> KVGroupLayout:
        return self.layout or KVGroupLayout.single(self.num_layers)

    @property
    def bytes_per_layer_token(self) -> int:
        """parts (K and V: 2; latent: 1) x kv_heads x (head_dim x dtype bytes + scale bytes):
        one layer."""
        return self.parts * self.num_kv_heads * (self.head_dim * self.dtype_bytes + self.scale_bytes)

    @property
    def bytes_per_token(self) -> int:
        """Every layer's KV of one token (what a sequence holds without freeing)."""
        return self.num_layers * self.bytes_per_layer_token

    @property
    def layers_per_block(self) -> int:
        return self.groups.layers_per_block

    @property
    def bytes_per_block(self) -> int:
        return self.layers_per_block * self.bytes_per_layer_token * self.block_size

    def num_blocks_for(self, budget_bytes: int) -> int:
        return budget_bytes // self.bytes_per_block

    def blocks_per_seq(self, seq_len: int, chunk: int = 1) -> int:
        """Pool blocks a sequence of `seq_len` tokens holds (all groups) while a step
        computes `chunk` of its tokens."""
        return self.groups.blocks_per_seq(seq_len, self.block_size, chunk)

    def bytes_per_seq(self, seq_len: int) -> int:
        return self.blocks_per_seq(seq_len) * self.bytes_per_block

    def bytes_per_seq_every_layer(self, seq_len: int) -> int:
        """What the sequence would hold keeping every layer's KV (no freeing)."""
        return -(-seq_len // self.block_size) * self.block_size * self.bytes_per_token

    def group_lines(self) -> list[str]:
        """Per group: layers, window and KV bytes per token (for logs and `plan`)."""
        return [f"group {i} ({g.kind}, layers {','.join(map(str, g.layers))}): "
                f"{len(g.layers) * self.bytes_per_layer_token} B/token"
                + ("" if g.window is None else f", at most {g.window} tokens kept")
                for i, g in enumerate(self.groups.groups)]
