"""The torch reference backend: gathered K/V and SDPA, on any device and dtype.

The fallback where no kernel applies (bf16 / fp16 on CPU, CUDA without Triton, no C++
kernels), and the paths the C++ backend keeps for what its kernels do not do (cpu.py).
Decodes gather each sequence's blocks into [D, kvh, nb*bs, d] and run one SDPA call with a
key mask built from the lengths; prefill rows run one SDPA call per sequence over its own
keys (nothing padded to the longest sequence). Queries of the G = heads / kv_heads heads
sharing a KV head are stacked along the query axis, so K/V are never repeated. The softmax
runs in fp32 (CPU inputs are made fp32; on CUDA the fused SDPA kernels accumulate in fp32).
An int8 / fp8 cache is written quantized (a scale per token per KV head at the same slot) and
dequantized as it is gathered.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedllm.model.layers import kv_quant
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.attention_backends.base import PagedAttentionBackend


def gather(cache: torch.Tensor, block_tables: torch.Tensor, scales: torch.Tensor | None,
           dtype: torch.dtype) -> torch.Tensor:
    """[num_blocks, bs, kvh, d] x [B, nb] -> [B, kvh, nb*bs, d] (dequantized / converted to
    `dtype`)."""
    b, nb = block_tables.shape
    _, bs, kvh, d = cache.shape
    x = kv_quant.raw(cache)[block_tables].view(cache.dtype).view(b, nb * bs, kvh, d)
    if scales is not None:
        x = kv_quant.dequantize(x, scales[block_tables].view(b, nb * bs, kvh), dtype)
    else:
        x = x.to(dtype)  # a float16 cache under fp32 queries (exact); else a no-op
    return x.transpose(1, 2)


def _softcapped(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                scale: float, softcap: float) -> torch.Tensor:
    """Attention with Gemma's logit soft-capping: scores -> tanh(scores / cap) * cap."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return (probs @ v.float()).to(q.dtype)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
         scale: float, softcap: float | None = None) -> torch.Tensor:
    if softcap:
        return _softcapped(q, k, v, mask, scale, softcap)
    if q.dtype != torch.float32 and q.device.type == "cpu":
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                             scale=scale)
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


class TorchBackend(PagedAttentionBackend):
    """Torch ops only (module docstring); runs everything, so selection falls back to it."""

    name = "torch"

    @classmethod
    def supports(cls, device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype,
                 head_size: int) -> bool:
        return True

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: LayerKVCache, meta: AttentionMetadata, scale: float,
                softcap: float | None = None) -> torch.Tensor:
        t, h, d = q.shape
        self.write(kv_cache.k, kv_cache.k_scale, meta.slot_mapping, k)
        self.write(kv_cache.v, kv_cache.v_scale, meta.slot_mapping, v)
        out = q.new_empty(t, h, d)
        nd = meta.num_decodes
        if nd:
            self.decode(out[:nd], q[:nd], kv_cache, meta, scale, softcap)
        if meta.prefill_block_tables is not None:
            self.prefill(out[nd:], q[nd:], kv_cache, meta, scale, softcap)
        return out.view(t, h * d)

    def write(self, cache: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor,
              x: torch.Tensor) -> None:
        """Store the rows x [T, kvh, d] at their slots (quantized, with scales, if 8-bit)."""
        kvh, d = x.shape[1:]
        if scales is None:  # the model dtype, or float16 under fp32 (rounded to nearest)
            cache.view(-1, kvh, d).index_copy_(0, slots, x.to(cache.dtype))
            return
        values, s = kv_quant.quantize(x, cache.dtype)
        kv_quant.raw(cache).view(-1, kvh, d).index_copy_(0, slots, kv_quant.raw(values))
        scales.view(-1, kvh).index_copy_(0, slots, s)

    def decode(self, out: torch.Tensor, q: torch.Tensor, kv: LayerKVCache,
               meta: AttentionMetadata, scale: float, softcap: float | None) -> None:
        """The decode rows q [D, H, d] (one query each, every key in its past, so no causal
        mask): one SDPA call over their gathered blocks, keys masked by length and window."""
        nd, h, d = q.shape
        kvh = kv.k.shape[2]
        qd = q.view(nd, kvh, h // kvh, d)
        kd = gather(kv.k, meta.decode_block_tables, kv.k_scale, q.dtype)
        vd = gather(kv.v, meta.decode_block_tables, kv.v_scale, q.dtype)
        out[:] = sdpa(qd, kd, vd, meta.decode_mask(kd.shape[2]), scale,
                      softcap).reshape(nd, h, d)

    def prefill(self, out: torch.Tensor, q: torch.Tensor, kv: LayerKVCache,
                meta: AttentionMetadata, scale: float, softcap: float | None) -> None:
        """The packed prefill rows: one SDPA call per sequence over its own keys, nothing
        padded to the longest sequence. Sequence p's query i (position L - n + i) sees keys
        max(0, pos - window + 1) .. pos."""
        _, h, d = q.shape
        kvh, bs = kv.k.shape[2], kv.k.shape[1]
        g = h // kvh
        starts = meta.prefill_query_start.tolist()
        lens = meta.prefill_seq_lens.tolist()
        for p, length in enumerate(lens):
            a, b = starts[p], starts[p + 1]
            n = b - a
            table = meta.prefill_block_tables[p:p + 1, :-(-length // bs)]
            k = gather(kv.k, table, kv.k_scale, q.dtype)[..., :length, :]   # [1, kvh, L, d]
            v = gather(kv.v, table, kv.v_scale, q.dtype)[..., :length, :]
            qp = q[a:b].view(n, kvh, g, d).permute(1, 2, 0, 3).reshape(1, kvh, g * n, d)
            q_pos = torch.arange(length - n, length, device=q.device)[:, None]
            keys = torch.arange(length, device=q.device)[None, :]
            mask = keys <= q_pos
            if meta.sliding_window:
                mask &= keys > q_pos - meta.sliding_window
            mask = mask[None, None].expand(1, g, n, length).reshape(1, 1, g * n, length)
            o = sdpa(qp, k, v, mask, scale, softcap)                        # [1, kvh, g*n, d]
            out[a:b] = o.view(kvh, g, n, d).permute(2, 0, 1, 3).reshape(n, h, d)
