"""Paged attention over a flattened batch of prefill chunks and decodes.

The runner orders the batch decodes first, then prefill chunks::

    tokens:  [d0 d1 ... d(D-1) | p0 p0 p0 p0 | p1 p1 | ...]
              one per decode      q_len tokens per prefill request, packed (varlen):
                                  prefill_query_start = [0, 4, 6, ...]

For every token its K/V is first written to its slot (`slot_mapping`); then each request
attends to its whole context (cached + new) read through its block table. Decodes need
no causal mask (one query, every key in the past); prefill queries see keys up to their own
position (`ctx_start + i`). On CPU the prefill rows of all sequences go to one C++ varlen
kernel (kernels/varlen_attention_cpu.cpp: flash-style, nothing padded to the longest prompt);
without it, one SDPA call per sequence. Queries of the G = heads / kv_heads heads sharing a KV
head are stacked along the query axis so K/V are never repeated. Scale is 1/sqrt(head_dim); the
softmax runs in fp32 (inputs are fp32 on CPU; on CUDA the fused SDPA kernels accumulate and
normalise in fp32).

With an int8 / fp8 cache (`kv_quant`), new K/V rows are quantized as they are written, with
one scale per token per KV head stored at the same slot in the scale pool; every read
dequantizes (the C++ decode kernel converts each row to fp32 as it reads it; the torch path
gathers, then multiplies by the scales), so prefill and decode both attend to the stored
8-bit values.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F

from pagedllm.kernels import cpu_ops
from pagedllm.kernels import triton as triton_ops
from pagedllm.model.layers import attention_triton, kv_quant
from pagedllm.model.layers.attention_train import CausalBatchMetadata, causal_attention
from pagedllm.model.layers.attention_triton import VarlenBatch

_KERNEL_DTYPES = (torch.float32, *kv_quant.QMAX)


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
class AttentionMetadata:
    """Per-step batch layout shared by every layer (built once by the runner)."""

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


def _gather(cache: torch.Tensor, block_tables: torch.Tensor, scales: torch.Tensor | None,
            dtype: torch.dtype) -> torch.Tensor:
    """[num_blocks, bs, kvh, d] x [B, nb] -> [B, kvh, nb*bs, d] (dequantized to `dtype`)."""
    b, nb = block_tables.shape
    _, bs, kvh, d = cache.shape
    x = kv_quant.raw(cache)[block_tables].view(cache.dtype).view(b, nb * bs, kvh, d)
    if scales is not None:
        x = kv_quant.dequantize(x, scales[block_tables].view(b, nb * bs, kvh), dtype)
    return x.transpose(1, 2)


def _write(cache: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor,
           x: torch.Tensor) -> None:
    """Store the rows x [T, kvh, d] at their slots (quantized, with scales, if 8-bit)."""
    kvh, d = x.shape[1:]
    if scales is None:
        cache.view(-1, kvh, d).index_copy_(0, slots, x)
        return
    if (ops := cpu_ops.fp32_ops(x)) is not None:
        ops.quantize_into_cache(x.contiguous(), cache, scales, slots)
        return
    values, s = kv_quant.quantize(x, cache.dtype)
    kv_quant.raw(cache).view(-1, kvh, d).index_copy_(0, slots, kv_quant.raw(values))
    scales.view(-1, kvh).index_copy_(0, slots, s)


def _softcapped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                scale: float, softcap: float) -> torch.Tensor:
    """Attention with Gemma's logit soft-capping: scores -> tanh(scores / cap) * cap."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return (probs @ v.float()).to(q.dtype)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
          scale: float, softcap: float | None = None) -> torch.Tensor:
    if softcap:
        return _softcapped(q, k, v, mask, scale, softcap)
    if q.dtype != torch.float32 and q.device.type == "cpu":
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                             scale=scale)
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def _use_cpu_kernel(q: torch.Tensor, cache: torch.Tensor) -> bool:
    return cache.dtype in _KERNEL_DTYPES and cpu_ops.fp32_ops(q) is not None


def _use_varlen_kernel(q: torch.Tensor, cache: torch.Tensor) -> bool:
    """The C++ varlen kernel (kernels/varlen_attention_cpu.cpp) runs fp32 CPU queries over a
    cache it reads (soft-capping included), head sizes a multiple of its vector width."""
    if not _use_cpu_kernel(q, cache):
        return False
    ops = cpu_ops.load_with("varlen_attention")
    return ops is not None and q.shape[-1] % ops.varlen_attention_head_multiple() == 0


def _prefill_torch(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, k_scale: torch.Tensor | None,
                   v_scale: torch.Tensor | None, meta: AttentionMetadata, scale: float,
                   softcap: float | None) -> None:
    """The prefill rows without the C++ kernel (bf16 / fp16, CUDA without Triton, no kernels):
    one SDPA call per sequence over its own keys, nothing padded to the longest sequence.
    Sequence p's query i (position L - n + i) sees keys max(0, pos - window + 1) .. pos."""
    _, h, d = q.shape
    kvh = k_cache.shape[2]
    g = h // kvh
    bs = k_cache.shape[1]
    starts = meta.prefill_query_start.tolist()
    lens = meta.prefill_seq_lens.tolist()
    for p, length in enumerate(lens):
        a, b = starts[p], starts[p + 1]
        n = b - a
        table = meta.prefill_block_tables[p:p + 1, :-(-length // bs)]
        k = _gather(k_cache, table, k_scale, q.dtype)[..., :length, :]     # [1, kvh, L, d]
        v = _gather(v_cache, table, v_scale, q.dtype)[..., :length, :]
        qp = q[a:b].view(n, kvh, g, d).permute(1, 2, 0, 3).reshape(1, kvh, g * n, d)
        q_pos = torch.arange(length - n, length, device=q.device)[:, None]
        keys = torch.arange(length, device=q.device)[None, :]
        mask = keys <= q_pos
        if meta.sliding_window:
            mask &= keys > q_pos - meta.sliding_window
        mask = mask[None, None].expand(1, g, n, length).reshape(1, 1, g * n, length)
        o = _sdpa(qp, k, v, mask, scale, softcap)                          # [1, kvh, g*n, d]
        out[a:b] = o.view(kvh, g, n, d).permute(2, 0, 1, 3).reshape(n, h, d)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float,
                    k_scale: torch.Tensor | None = None,
                    v_scale: torch.Tensor | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """q [T, H, d], k/v [T, kvh, d] -> [T, H*d]. Writes k/v into the caches first.

    `k_scale` / `v_scale` are the scale pools of an int8 / fp8 cache (None otherwise).
    `softcap` (Gemma's attn_logit_softcapping) caps the scores (torch path on CPU).
    With `meta.varlen` (CUDA) the Triton kernels do it all (attention_triton.py).
    """
    if isinstance(meta, CausalBatchMetadata):  # training forward (pagedllm.finetune)
        return causal_attention(q, k, v, meta, scale, softcap)
    if meta.varlen is not None and triton_ops.enabled(q):
        return attention_triton.paged_attention(q, k, v, k_cache, v_cache, meta, scale,
                                                k_scale, v_scale, softcap)
    t, h, d = q.shape
    kvh = k.shape[1]
    g = h // kvh
    _write(k_cache, k_scale, meta.slot_mapping, k)
    _write(v_cache, v_scale, meta.slot_mapping, v)
    out = q.new_empty(t, h, d)
    nd = meta.num_decodes
    if nd and not softcap and _use_cpu_kernel(q, k_cache):
        out_d = out[:nd]
        if k_scale is None:
            cpu_ops.load().paged_decode_attention(
                out_d, q[:nd].contiguous(), k_cache, v_cache, meta.decode_block_tables,
                meta.decode_seq_lens, scale, meta.sliding_window or 0)
        else:
            cpu_ops.load().paged_decode_attention_quant(
                out_d, q[:nd].contiguous(), k_cache, v_cache, k_scale, v_scale,
                meta.decode_block_tables, meta.decode_seq_lens, scale,
                meta.sliding_window or 0)
    elif nd:
        qd = q[:nd].view(nd, kvh, g, d)
        kd = _gather(k_cache, meta.decode_block_tables, k_scale, q.dtype)
        vd = _gather(v_cache, meta.decode_block_tables, v_scale, q.dtype)
        out[:nd] = _sdpa(qd, kd, vd, meta.decode_mask(kd.shape[2]), scale,
                         softcap).reshape(nd, h, d)
    if meta.prefill_block_tables is not None:
        if _use_varlen_kernel(q, k_cache):
            qp = q[nd:] if q.stride(2) == 1 and q.stride(1) == d else q[nd:].contiguous()
            cpu_ops.load().paged_varlen_attention(
                out[nd:], qp, k_cache, v_cache, k_scale, v_scale,
                meta.prefill_block_tables, meta.prefill_seq_lens, meta.prefill_query_start,
                scale, meta.sliding_window or 0, softcap or 0.0)
        else:
            _prefill_torch(out[nd:], q[nd:], k_cache, v_cache, k_scale, v_scale, meta, scale,
                           softcap)
    return out.view(t, h * d)


def cpu_decode_step(x: torch.Tensor, meta: AttentionMetadata, k_cache: torch.Tensor) -> bool:
    """Whether this step's rows x are all decodes (one token of its own sequence each) that
    the C++ decode kernels run: fp32 CPU rows, a cache dtype they read, no varlen batch."""
    return (isinstance(meta, AttentionMetadata) and meta.num_decodes == x.shape[0] > 0
            and meta.varlen is None and _use_cpu_kernel(x, k_cache))


def paged_attention_qkv(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                        kv_cache: LayerKVCache, meta: AttentionMetadata, scale: float,
                        softcap: float | None = None) -> torch.Tensor:
    """`paged_attention` over the fused rows of a qkv projection, qkv [T, (H + 2 kvh) d]
    -> [T, H d]. A step of decodes only on CPU is one C++ call that writes the new K/V and
    attends reading the queries in place (kernels/paged_attention_cpu.cpp); every other
    batch splits the rows and runs `paged_attention`."""
    t = qkv.shape[0]
    if not softcap and qkv.is_contiguous() and cpu_decode_step(qkv, meta, kv_cache.k):
        return cpu_ops.load().paged_decode_attention_qkv(
            qkv, kv_cache.k, kv_cache.v, kv_cache.k_scale, kv_cache.v_scale,
            meta.slot_mapping, meta.decode_block_tables, meta.decode_seq_lens, num_heads,
            scale, meta.sliding_window or 0)
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = qkv.split([q_size, kv_size, kv_size], -1)
    return paged_attention(q.view(t, num_heads, head_dim), k.view(t, num_kv_heads, head_dim),
                           v.view(t, num_kv_heads, head_dim), kv_cache.k, kv_cache.v, meta,
                           scale, kv_cache.k_scale, kv_cache.v_scale, softcap=softcap)
