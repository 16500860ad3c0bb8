"""The attention backend contract, and the one builder of paged attention metadata.

A backend is chosen once per rank at start-up (`registry.select_backend`, called by
worker/rank_builder.py) and handed to whoever builds a step's metadata: the runner's input
batch, a tensor-parallel rank, the draft model's decode steps and the CUDA-graph capture. The
metadata it builds carries it (`meta.backend`), so every attention layer runs the backend its
metadata was built for, and nothing on the forward path asks what kind of batch or device it
has::

    start-up     backend = select_backend(device, dtype, kv_dtype, head_size)
    each step    meta = backend.build_metadata(layout)          worker/input_batch.py
    each layer   out  = meta.backend.forward_qkv(qkv, ..., kv_cache, meta, scale)

`BatchLayout` is what the builder reads: the host arrays of one forward pass, requests in batch
order (decodes first, then prefill chunks)::

    requests          r0    r1  |  r2 (a chunk of 3 after 5 cached tokens)
    q_lens             1     1  |   3
    seq_lens          18     5  |   8            tokens after this step
    query_start     [0,    1,       2,        5]  request i's rows are qs[i] .. qs[i+1]-1
    token_request   [0,    1,   2,  2,  2]
    positions       [17,   4,   5,  6,  7]
    slot(pos) = block_table[r, pos // block_size] * block_size + pos % block_size
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np
import torch

from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache, VarlenBatch


@dataclass
class BatchLayout:
    """The host arrays (numpy int64) of one forward pass that attention metadata is built
    from (module docstring). The first `num_decode_reqs` requests run on the decode path,
    one row per query token. `window` is KV group 0's attention window, `group_tables` /
    `group_windows` those of groups 1.. (group 0's table is `block_table`; the windows come
    from the KV groups' specs, core/kv_groups.py)."""

    block_size: int
    q_lens: np.ndarray         # [n]
    seq_lens: np.ndarray       # [n]
    query_start: np.ndarray    # [n + 1]
    token_request: np.ndarray  # [T]
    positions: np.ndarray      # [T]
    block_table: np.ndarray    # [n, max_blocks]
    num_decode_reqs: int
    group_tables: list[np.ndarray] = field(default_factory=list)
    group_windows: list[int | None] = field(default_factory=list)
    window: int | None = None

    def slots(self, table: np.ndarray) -> np.ndarray:
        """[T] the flat slot of each token's K/V in the blocks `table` names."""
        bs, pos = self.block_size, self.positions
        return table[self.token_request, pos // bs] * bs + pos % bs


class AttentionBackend(ABC):
    """One way of running attention (torch reference, C++ CPU kernels, Triton, training).

    Contract:
      `name`             its key in the registry (registry.BACKENDS)
      `supports(...)`    whether it runs this device / query dtype / KV dtype / head size;
                         asked once, at selection
      `forward(...)`     q [T, H, d], k / v [T, kvh, d] -> [T, H*d]: writes the new K/V into
                         the layer's cache (at `meta.slot_mapping`), then attends
      `forward_qkv(...)` the same over the fused rows of a qkv projection
      `fused_decode_applies(...)`  whether this step may run the model's fused C++ decode
                         loop (model/fused_decode.py) instead of its layers
      `cuda_graphs`      its forward never waits on the host, so a decode step can be
                         captured in a CUDA graph (worker/cuda_graphs.py)
    Each backend also builds its own metadata (`build_metadata`); the backends of the paged
    KV cache share `PagedAttentionBackend`'s builder.
    """

    name: ClassVar[str]
    cuda_graphs: ClassVar[bool] = False

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.device})"

    @classmethod
    @abstractmethod
    def supports(cls, device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype,
                 head_size: int) -> bool:
        """Whether it runs `dtype` queries over a `kv_dtype` cache on `device`."""

    @abstractmethod
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: LayerKVCache, meta, scale: float,
                softcap: float | None = None) -> torch.Tensor:
        """q [T, H, d], k / v [T, kvh, d] -> [T, H*d] (class docstring). `softcap`
        (Gemma's attn_logit_softcapping) caps the scores: tanh(s / cap) * cap."""

    def forward_qkv(self, qkv: torch.Tensor, num_heads: int, num_kv_heads: int,
                    head_dim: int, kv_cache: LayerKVCache, meta, scale: float,
                    softcap: float | None = None) -> torch.Tensor:
        """`forward` over fused qkv rows [T, (H + 2 kvh) d] -> [T, H d]."""
        t = qkv.shape[0]
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        q, k, v = qkv.split([q_size, kv_size, kv_size], -1)
        return self.forward(q.view(t, num_heads, head_dim), k.view(t, num_kv_heads, head_dim),
                            v.view(t, num_kv_heads, head_dim), kv_cache, meta, scale, softcap)

    #: whether the backend runs the kernels the fused C++ decode loop calls (cpu.py): the
    #: engine plans several decode steps per call only then (core/multi_step.py)
    runs_fused_decode: ClassVar[bool] = False

    def fused_decode_applies(self, x: torch.Tensor, meta,
                             kv_caches: list[LayerKVCache]) -> bool:
        """Whether this step's rows x may take the fused C++ decode loop: no, unless the
        backend runs the kernels that loop calls (cpu.py)."""
        return False


class PagedAttentionBackend(AttentionBackend):
    """A backend over the paged KV cache; the one builder of `AttentionMetadata`.

    `whole_batch`: the backend's kernel reads the whole mixed batch at once
    (`meta.varlen`, Triton) rather than the decode and prefill parts.
    """

    whole_batch: ClassVar[bool] = False

    def _to(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

    def build_metadata(self, layout: BatchLayout) -> AttentionMetadata:
        """The metadata of one forward pass from its host arrays: slots, the decode rows'
        tables and lengths, the packed prefill rows' tables, offsets and lengths, and with
        several KV groups each group's slots and tables (`meta.groups`)."""
        to, bt = self._to, layout.block_table
        q_lens, seq_lens, cu = layout.q_lens, layout.seq_lens, layout.query_start
        n, nr = len(q_lens), layout.num_decode_reqs
        nd = int(cu[nr])  # the decoding requests' tokens: the decode rows
        req_idx, bs = layout.token_request, layout.block_size
        dec_bt = dec_lens = pre_bt = pre_qs = pre_lens = None
        if nd:  # decodes need no mask from here: the torch path derives it
            width_blocks = int(-(-seq_lens[:nr].max() // bs))
            dec_bt = to(bt[req_idx[:nd], :width_blocks])
            dec_lens = to(layout.positions[:nd] + 1)
        if nr < n:  # packed prefill rows: offsets from the first of them, lengths after it
            width_blocks = int(-(-seq_lens[nr:].max() // bs))
            pre_bt = to(bt[nr:, :width_blocks])
            pre_qs = to(cu[nr:] - cu[nr])
            pre_lens = to(seq_lens[nr:])
        meta = AttentionMetadata(
            slot_mapping=to(layout.slots(bt)), num_decodes=nd, decode_block_tables=dec_bt,
            decode_seq_lens=dec_lens, sliding_window=layout.window,
            prefill_block_tables=pre_bt, prefill_query_start=pre_qs, prefill_seq_lens=pre_lens,
            varlen=VarlenBatch(to(bt), to(seq_lens), to(cu.astype(np.int32)),
                               int(q_lens.max())) if self.whole_batch else None,
            backend=self)
        if layout.group_tables:
            meta.groups = [meta]
            for bt_g, window in zip(layout.group_tables, layout.group_windows, strict=True):
                meta.groups.append(_group_metadata(
                    meta, window, to(layout.slots(bt_g)),
                    None if dec_bt is None else to(bt_g[req_idx[:nd], :dec_bt.shape[1]]),
                    None if pre_bt is None else to(bt_g[nr:, :pre_bt.shape[1]]),
                    None if meta.varlen is None else to(bt_g)))
        return meta

    def graph_metadata(self, slot_mapping: torch.Tensor, block_tables: torch.Tensor,
                       seq_lens: torch.Tensor, query_start: torch.Tensor,
                       sliding_window: int | None,
                       groups: Sequence[tuple[torch.Tensor, torch.Tensor, int | None]] = (),
                       ) -> AttentionMetadata:
        """Decode-only metadata over persistent device buffers (a CUDA graph's inputs,
        worker/cuda_graphs.py): nothing is copied, so a replay reads what the buffers hold.
        `query_start` [B + 1] int32 is 0, 1, .., B (one query per sequence). `groups`: with
        several KV groups, each further group's (slots, block tables, window) buffers, as
        `build_metadata` gives them in `meta.groups`."""
        b = slot_mapping.shape[0]
        meta = AttentionMetadata(
            slot_mapping=slot_mapping, num_decodes=b, decode_block_tables=block_tables,
            decode_seq_lens=seq_lens, sliding_window=sliding_window, prefill_block_tables=None,
            varlen=VarlenBatch(block_tables, seq_lens, query_start, 1)
            if self.whole_batch else None, backend=self)
        if groups:
            meta.groups = [meta]
            for slots_g, bt_g, window in groups:
                meta.groups.append(_group_metadata(meta, window, slots_g, bt_g, None, bt_g))
        return meta


def _group_metadata(meta: AttentionMetadata, window: int | None, slot_mapping: torch.Tensor,
                    decode_block_tables: torch.Tensor | None,
                    prefill_block_tables: torch.Tensor | None,
                    varlen_block_tables: torch.Tensor | None) -> AttentionMetadata:
    """A further KV group's metadata: group 0's `meta` for the group's window, over the
    group's own slots and block tables (the whole batch's for the varlen kernel)."""
    return replace(meta.for_window(window), _windowed={}, groups=None, decode_key_mask=None,
                   slot_mapping=slot_mapping, decode_block_tables=decode_block_tables,
                   prefill_block_tables=prefill_block_tables,
                   varlen=None if meta.varlen is None
                   else replace(meta.varlen, block_tables=varlen_block_tables))
