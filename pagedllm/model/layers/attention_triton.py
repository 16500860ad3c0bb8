"""The Triton attention backend (CUDA; CPU only in Triton's interpreter, for tests).

One kernel launch per layer serves the whole mixed batch (decodes and prefill chunks, see
kernels/triton/attention.py) from `AttentionMetadata.varlen`, and one per K and V writes
the new rows (quantized for an int8 / fp8 cache). Unlike the torch path nothing is
gathered, padded to the longest context or masked with a [P, q, L] tensor, and nothing
synchronises with the host, so the same code runs inside a captured CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


def write_kv(cache: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor,
             x: torch.Tensor) -> None:
    from pagedllm.kernels.triton import kv_write

    if scales is None:
        kv_write.write_into_cache(x, cache, slots)
    else:
        kv_write.quantize_into_cache(x, cache, scales, slots)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor, meta, scale: float,
                    k_scale: torch.Tensor | None, v_scale: torch.Tensor | None,
                    softcap: float | None) -> torch.Tensor:
    """attention.paged_attention's contract: q [T, H, d], k/v [T, kvh, d] -> [T, H*d]."""
    from pagedllm.kernels.triton import attention

    t, h, d = q.shape
    write_kv(k_cache, k_scale, meta.slot_mapping, k)
    write_kv(v_cache, v_scale, meta.slot_mapping, v)
    out = q.new_empty(t, h, d)
    vb = meta.varlen
    attention.paged_varlen_attention(
        out, q, k_cache, v_cache, vb.block_tables, vb.seq_lens, vb.query_start_loc,
        vb.max_query_len, scale, meta.sliding_window or 0, k_scale, v_scale, softcap or 0.0)
    return out.view(t, h * d)
