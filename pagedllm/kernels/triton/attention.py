"""Paged attention over the block tables for decodes and (chunked) prefills, one kernel.

One program per (sequence, KV head, query tile). A tile's rows are the flattened
(query token, head of the KV head's group) pairs, so the G = heads / kv_heads query heads
that share a KV head read each K/V row once (GQA without repeating K/V)::

    rows of a tile:  (t0,g0) (t0,g1) (t0,g2) (t1,g0) ...       BLOCK_M rows
    keys:            j = lo .. hi-1 in tiles of BLOCK_N, slot(j) = table[j // bs] * bs + j % bs
    query t sees key j  iff  j <= pos(t) = seq_len - q_len + t   (and j > pos(t) - window)

A decode is a sequence with q_len 1 (its G rows in one tile). Softmax is the online
(flash) softmax in fp32 over the key tiles; scores are q.k * scale (optionally soft-capped,
tanh(s / cap) * cap); an 8-bit cache's values are decoded in registers (bits.decode8) and
its float16 scales multiply the scores (K) and the probabilities (V), as the C++ kernel
does. Matrix products take the query dtype (tensor cores for bf16 / fp16; fp32 in IEEE
precision) and accumulate in fp32; under TRITON_INTERPRET they run in fp32 (the interpreter
gets bf16 products wrong).

`paged_decode_attention` / `paged_decode_attention_quant` keep the C++ kernels' signatures
(kernels/paged_attention_cpu.cpp); `paged_varlen_attention` is the whole mixed batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedllm.kernels.triton import interpreted
from pagedllm.kernels.triton.bits import cast, code_of, decode8, raw_view


@triton.jit
def _paged_attention_kernel(
        out_ptr, q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, lens_ptr, qstart_ptr,
        scale, softcap, window, stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
        KVH: tl.constexpr, G: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
        BS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        CODE: tl.constexpr, SOFTCAP: tl.constexpr, FP32: tl.constexpr):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(qstart_ptr + seq).to(tl.int64)
    q_len = (tl.load(qstart_ptr + seq + 1) - q_start).to(tl.int32)
    seq_len = tl.load(lens_ptr + seq).to(tl.int32)
    if tile * BLOCK_M < q_len * G:
        rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        tok = rows // G
        head = kvh * G + rows % G
        row_ok = tok < q_len
        pos = seq_len - q_len + tok                          # absolute query positions
        d = tl.arange(0, D_PAD)
        d_ok = d < D
        q = tl.load(q_ptr + (q_start + tok)[:, None] * stride_qt
                    + head[:, None] * stride_qh + d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        last = tl.minimum(seq_len - q_len + (tile * BLOCK_M + BLOCK_M - 1) // G, seq_len - 1)
        hi = last + 1
        lo = 0
        lo_exact = 0  # keys below it are outside every row's window: never loaded (their
        if window > 0:  # blocks may be freed already, see core/ sliding-window freeing)
            first = seq_len - q_len + (tile * BLOCK_M) // G
            lo_exact = tl.maximum(first - window + 1, 0)
            lo = (lo_exact // BLOCK_N) * BLOCK_N
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
        for start in range(lo, hi, BLOCK_N):
            j = start + tl.arange(0, BLOCK_N)
            j_ok = (j < hi) & (j >= lo_exact)
            block = tl.load(bt_ptr + seq * stride_bt + j // BS, mask=j_ok, other=0).to(tl.int64)
            slot = block * BS + j % BS
            kv_off = (slot * KVH + kvh)[:, None] * D + d[None, :]
            kv_mask = j_ok[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0)
            if CODE != 0:
                k = decode8(k, CODE)
            if FP32:
                s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k.to(q.dtype)))
            if CODE != 0:
                k_scale = tl.load(ks_ptr + slot * KVH + kvh, mask=j_ok, other=0.0)
                s = s * k_scale.to(tl.float32)[None, :]
            s = s * scale
            if SOFTCAP:
                s = s / softcap
                s = (1.0 - 2.0 / (tl.exp(2.0 * s) + 1.0)) * softcap   # tanh(s) * cap
            visible = (j[None, :] <= pos[:, None]) & j_ok[None, :]
            if window > 0:
                visible = visible & (j[None, :] > pos[:, None] - window)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0)
            if CODE != 0:
                v = decode8(v, CODE)
                v_scale = tl.load(vs_ptr + slot * KVH + kvh, mask=j_ok, other=0.0)
                p = p * v_scale.to(tl.float32)[None, :]
            if FP32:
                acc += tl.dot(p, v.to(tl.float32), input_precision="ieee")
            else:
                acc += tl.dot(p.to(q.dtype), v.to(q.dtype))
            m_i = m_new
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(out_ptr + (q_start + tok)[:, None] * stride_ot + head[:, None] * stride_oh
                 + d[None, :], cast(out, out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])


def _tile_sizes(max_query_len: int, g: int, d: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): at least 16 rows / keys (tensor-core minimum); prefill tiles of
    64 rows, smaller for head_dim 256 to keep the tiles in registers."""
    rows = max_query_len * g
    block_m = max(16, min(triton.next_power_of_2(rows), 64 if d <= 128 else 32))
    return block_m, 64 if d <= 128 else 32


def paged_varlen_attention(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                           v_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                           max_query_len: int, scale: float, window: int = 0,
                           k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None,
                           softcap: float = 0.0) -> None:
    """out/q [T, H, d]; the new tokens of sequence i are rows query_start_loc[i] ..
    query_start_loc[i+1]-1 and it has seq_lens[i] tokens in all (cached + new; its K/V are
    already in the cache). block_tables [B, max_blocks]; caches [blocks, bs, kvh, d] (int8 /
    fp8 with float16 scales [blocks, bs, kvh]); window 0 = none; softcap 0 = none."""
    t, h, d = q.shape
    _, bs, kvh, dk = k_cache.shape
    if dk != d or h % kvh:
        raise ValueError(f"q [{t}, {h}, {d}] does not fit a cache of {kvh} kv heads x {dk}")
    if q.stride(-1) != 1 or out.stride(-1) != 1 or not k_cache.is_contiguous():
        raise ValueError("q, out and the caches need contiguous head_dim rows")
    code = code_of(k_cache.dtype)
    if code and (k_scale is None or v_scale is None):
        raise ValueError(f"an {k_cache.dtype} cache needs its k_scale and v_scale")
    b = seq_lens.shape[0]
    if t == 0 or b == 0:
        return
    g = h // kvh
    block_m, block_n = _tile_sizes(max_query_len, g, d)
    grid = (b, kvh, triton.cdiv(max_query_len * g, block_m))
    dummy = seq_lens  # never read without a quantized cache
    _paged_attention_kernel[grid](
        out, q, raw_view(k_cache), raw_view(v_cache),
        k_scale if code else dummy, v_scale if code else dummy,
        block_tables, seq_lens, query_start_loc, float(scale), float(softcap or 1.0),
        int(window or 0), q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), KVH=kvh, G=g, D=d, D_PAD=triton.next_power_of_2(d), BS=bs,
        BLOCK_M=block_m, BLOCK_N=block_n, CODE=code, SOFTCAP=bool(softcap),
        # Triton's interpreter (3.9) computes bf16 dot products wrongly: fp32 there.
        FP32=q.dtype == torch.float32 or interpreted())


def _decode_starts(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n + 1, dtype=torch.int32, device=device)


def paged_decode_attention(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                           v_cache: torch.Tensor, block_tables: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float, window: int,
                           softcap: float = 0.0) -> None:
    """The C++ kernel's contract: one query per sequence, out/q [D, H, d]; seq_lens[i] keys
    of sequence i (the new token's included). A sequence with seq_len 0 (a padded CUDA-graph
    row) gets zeros."""
    paged_varlen_attention(out, q, k_cache, v_cache, block_tables, seq_lens,
                           _decode_starts(q.shape[0], q.device), 1, scale, window,
                           softcap=softcap)


def paged_decode_attention_quant(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                                 v_cache: torch.Tensor, k_scale: torch.Tensor,
                                 v_scale: torch.Tensor, block_tables: torch.Tensor,
                                 seq_lens: torch.Tensor, scale: float, window: int,
                                 softcap: float = 0.0) -> None:
    """`paged_decode_attention` over an int8 / fp8 cache with its float16 scales."""
    paged_varlen_attention(out, q, k_cache, v_cache, block_tables, seq_lens,
                           _decode_starts(q.shape[0], q.device), 1, scale, window,
                           k_scale, v_scale, softcap)
