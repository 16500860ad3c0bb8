"""The Triton backend (CUDA; on CPU only in Triton's interpreter, for tests).

One kernel launch per layer serves the whole mixed batch (decodes and prefill chunks, see
kernels/triton/attention.py) from `AttentionMetadata.varlen`, and one per K and V writes the
new rows (quantized for an int8 / fp8 cache). Unlike the torch reference nothing is gathered,
padded to the longest context or masked with a [P, q, L] tensor, and nothing synchronises with
the host, so the same code runs inside a captured CUDA graph (`cuda_graphs`).

Whether it runs is `kernels.triton.enabled_for(device)`: on CUDA when triton imports, unless
PAGEDLLM_ATTENTION_BACKEND=torch; with PAGEDLLM_ATTENTION_BACKEND=triton also on CPU tensors
in Triton's interpreter (TRITON_INTERPRET=1). Any head size runs (the kernel pads it).
"""

from __future__ import annotations

import torch

from pagedllm.kernels import triton as triton_ops
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.attention_backends.base import PagedAttentionBackend


def write_kv(cache: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor,
             x: torch.Tensor) -> None:
    """Store the rows x [T, kvh, d] at their slots (quantized, with scales, if 8-bit)."""
    from pagedllm.kernels.triton import kv_write

    if scales is None:
        kv_write.write_into_cache(x, cache, slots)
    else:
        kv_write.quantize_into_cache(x, cache, scales, slots)


class TritonBackend(PagedAttentionBackend):
    """The Triton kernels over the whole batch (module docstring)."""

    name = "triton"
    cuda_graphs = True
    whole_batch = True

    @classmethod
    def supports(cls, device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype,
                 head_size: int) -> bool:
        return triton_ops.enabled_for(device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: LayerKVCache, meta: AttentionMetadata, scale: float,
                softcap: float | None = None) -> torch.Tensor:
        from pagedllm.kernels.triton import attention

        t, h, d = q.shape
        write_kv(kv_cache.k, kv_cache.k_scale, meta.slot_mapping, k)
        write_kv(kv_cache.v, kv_cache.v_scale, meta.slot_mapping, v)
        out = q.new_empty(t, h, d)
        vb = meta.varlen
        attention.paged_varlen_attention(
            out, q, kv_cache.k, kv_cache.v, vb.block_tables, vb.seq_lens, vb.query_start_loc,
            vb.max_query_len, scale, meta.sliding_window or 0, kv_cache.k_scale,
            kv_cache.v_scale, softcap or 0.0)
        return out.view(t, h * d)
