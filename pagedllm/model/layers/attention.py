"""The attention metadata of one step and each layer's view of the KV cache.

The runner orders the batch decodes first, then prefill chunks::

    tokens:  [d0 d1 ... d(D-1) | p0 p0 p0 p0 | p1 p1 | ...]
              one per decode      q_len tokens per prefill request, packed (varlen):
                                  prefill_query_start = [0, 4, 6, ...]

For every token its K/V is first written to its slot (`slot_mapping`); then each request
attends to its whole context (cached + new) read through its block table. Decodes need
no causal mask (one query, every key in the past); prefill queries see keys up to their own
position (`ctx_start + i`). Scale is the layer's; the softmax runs in fp32.

The metadata is built by an attention backend (attention_backends/: torch reference, C++
CPU kernels, Triton, training) and carries it, so a layer runs `meta.backend.forward_qkv`:
the backend was chosen once at start-up, and nothing on the forward path asks again.

With an int8 / fp8 cache (`kv_quant`), new K/V rows are quantized as they are written, with
one scale per token per KV head stored at the same slot in the scale pool; every read
dequantizes, so prefill and decode both attend to the stored 8-bit values.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from pagedllm.model.layers.attention_backends.base import PagedAttentionBackend


class LayerKVCache(NamedTuple):
    """One layer's views of the pools: K/V [num_blocks, block_size, kv_heads, head_dim] and,
    for an int8 / fp8 cache, their scales [num_blocks, block_size, kv_heads] (else None);
    `group` is the layer's KV group (core/kv_groups.py), whose block table it reads."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    group: int = 0


@dataclass
class VarlenBatch:
    """Every request of the step in batch order (decodes first), for the Triton kernel:

        query_start_loc [B + 1] int32   request i's new tokens are rows qsl[i] .. qsl[i+1]-1
        seq_lens        [B]             its tokens in all after this step (cached + new)
        block_tables    [B, max_blocks]
    """

    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    max_query_len: int


@dataclass
class AttentionMetadata:
    """Per-step batch layout shared by every layer, built once per step by the backend's
    builder (attention_backends/base.py), which it carries as `backend`."""

    slot_mapping: torch.Tensor          # [T] int64 flat slot of each new token
    num_decodes: int                    # first D tokens are single-token decodes
    decode_block_tables: torch.Tensor | None   # [D, max_blocks_d] int64
    decode_seq_lens: torch.Tensor | None       # [D] int64 context length incl. the new token
    sliding_window: int | None
    prefill_block_tables: torch.Tensor | None  # [P, max_blocks_p]
    # Packed prefill rows (varlen): sequence p's rows are nd + qs[p] .. nd + qs[p + 1] - 1 of
    # the batch, its length after this step prefill_seq_lens[p] (cached + new tokens).
    prefill_query_start: torch.Tensor | None = None   # [P + 1] int64, from 0
    prefill_seq_lens: torch.Tensor | None = None      # [P] int64
    # [D, 1, 1, Ld] bool, True = attend: only the torch decode path needs it (the C++ kernel
    # reads seq_lens), so the first layer on that path builds it and the others reuse it.
    decode_key_mask: torch.Tensor | None = None
    # The whole batch for the Triton backend (CUDA), built instead of the prefill mask.
    varlen: VarlenBatch | None = None
    # Per-layer windows (Gemma 3): the metadata of each window, built once per step.
    _windowed: dict[int, AttentionMetadata] = field(default_factory=dict, repr=False)
    # With several KV groups: group g's metadata (its slots and block tables); [0] is self.
    groups: list[AttentionMetadata] | None = field(default=None, repr=False)
    # The backend that built it and runs its layers (None only in hand-made test metadata).
    backend: PagedAttentionBackend | None = field(default=None, repr=False)

    def for_layer(self, kv_cache: LayerKVCache, window: int | None) -> AttentionMetadata:
        """The metadata of a layer: its KV group's block tables, its window's mask."""
        meta = self if self.groups is None else self.groups[kv_cache.group]
        return meta.for_window(window)

    def for_window(self, window: int | None) -> AttentionMetadata:
        """This step's metadata for a layer that sees only the last `window` keys of each
        query (None: this metadata); the kernels and the torch path mask by position, so only
        the window changes. Built by the first layer of that window, reused after."""
        if window is None or window == self.sliding_window:
            return self
        if window not in self._windowed:
            both = window if self.sliding_window is None else min(window, self.sliding_window)
            self._windowed[window] = replace(self, sliding_window=both, decode_key_mask=None,
                                             _windowed={}, groups=None)
        return self._windowed[window]

    def sequence_lengths(self, positions: torch.Tensor) -> torch.Tensor:
        """[T] the length each token's sequence reaches in this step (its last position + 1).

            tokens:     d0   d1  | p0 p0 p0 | p1 p1
            positions:  17    4  |  5  6  7 |  0  1
            lengths:    18    5  |  8  8  8 |  2  2
        """
        lengths = positions + 1
        if self.prefill_seq_lens is None:
            return lengths
        q_lens = self.prefill_query_start.diff()
        prefill = self.prefill_seq_lens.repeat_interleave(q_lens)
        return torch.cat([lengths[:self.num_decodes], prefill.to(lengths.dtype)])

    def decode_mask(self, width: int) -> torch.Tensor:
        """The decodes' key mask over `width` gathered keys (block table width x block size)."""
        if self.decode_key_mask is None:
            lens = self.decode_seq_lens[:, None]
            keys = torch.arange(width, device=lens.device)[None, :]
            mask = keys < lens
            if self.sliding_window:
                mask &= keys >= lens - self.sliding_window
            self.decode_key_mask = mask[:, None, None, :]
        return self.decode_key_mask
