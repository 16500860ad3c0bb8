"""The Triton kernels (pagedllm/kernels/triton/) against plain torch references.

On a machine without GPU they run in Triton's interpreter (tests/conftest.py sets
TRITON_INTERPRET=1 before anything imports triton); on a GPU the same tests run the
compiled kernels. triton is a dev dependency: without it this module fails to import.
Shapes are the smallest that cover each case (the interpreter runs every program in Python).
"""

from __future__ import annotations

import math

import pytest
import torch
import triton  # noqa: F401  - a missing triton must fail these tests, not skip them

from pagedllm.kernels.triton import attention, fused, kv_write
from pagedllm.model.layers import kv_quant
from pagedllm.model.layers.norm import GemmaRMSNorm, RMSNorm
from pagedllm.model.layers.rotary import RotaryEmbedding

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference_attention(q, k_cache, v_cache, tables, lens, starts, scale, window=0,
                        k_scale=None, v_scale=None, softcap=0.0):
    """Per sequence: gather its keys, dequantize, repeat for GQA, causal + window mask."""
    t, h, d = q.shape
    _, bs, kvh, _ = k_cache.shape
    out = torch.zeros(t, h, d, dtype=torch.float32, device=q.device)
    for i in range(len(lens)):
        n, a, b = int(lens[i]), int(starts[i]), int(starts[i + 1])
        pos = torch.arange(n, device=q.device)
        slots = tables[i, pos // bs] * bs + pos % bs

        def rows(cache, scales, slots=slots):
            x = kv_quant.raw(cache).view(-1, kvh, d)[slots].view(cache.dtype).float()
            if scales is not None:
                x = x * scales.view(-1, kvh)[slots].float()[..., None]
            return x.repeat_interleave(h // kvh, 1)

        k, v = rows(k_cache, k_scale), rows(v_cache, v_scale)
        s = torch.einsum("thd,jhd->htj", q[a:b].float(), k) * scale
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        q_pos = n - (b - a) + torch.arange(b - a, device=q.device)
        visible = pos[None, :] <= q_pos[:, None]
        if window:
            visible &= pos[None, :] > q_pos[:, None] - window
        out[a:b] = torch.einsum("htj,jhd->thd", s.masked_fill(~visible, -math.inf).softmax(-1), v)
    return out


def make_batch(block_size, gqa, kv_heads, head_dim, q_lens, ctx_lens, cache_dtype=None,
               q_dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-(c + q) // block_size) for c, q in zip(ctx_lens, q_lens, strict=True)) + 2
    k = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    k_scale = v_scale = None
    if cache_dtype is not None:
        (k, k_scale), (v, v_scale) = kv_quant.quantize(k, cache_dtype), kv_quant.quantize(v, cache_dtype)
    lens = torch.tensor([c + q for c, q in zip(ctx_lens, q_lens, strict=True)])
    width = int(max(-(-n // block_size) for n in lens.tolist()))
    perm = torch.randperm(num_blocks, generator=g)  # blocks scattered over the pool
    tables = torch.stack([perm[i * width % num_blocks:][:width] if i * width + width <= num_blocks
                          else torch.randperm(num_blocks, generator=g)[:width]
                          for i in range(len(lens))])
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(starts[-1]), gqa * kv_heads, head_dim, generator=g).to(q_dtype)
    to = lambda x: None if x is None else x.to(DEVICE)  # noqa: E731
    return (to(q), to(k), to(v), to(tables), to(lens), to(starts), to(k_scale), to(v_scale))


def _tolerance(q_dtype):
    return 2e-5 if q_dtype == torch.float32 else 3e-2


# block sizes 8 / 16 / 32, GQA ratios 1 / 3 / 8, head dims 64 / 128 / 256, 8-bit caches,
# sliding windows, soft-capping, bf16 / fp16 queries: each case as small as it can be.
DECODE_CASES = [
    # block_size, gqa, kv_heads, head_dim, cache dtype, window, softcap, q dtype
    (16, 1, 2, 64, None, 0, 0.0, torch.float32),
    (8, 3, 1, 128, None, 0, 0.0, torch.float32),
    (32, 8, 1, 256, None, 0, 0.0, torch.float32),
    (16, 3, 2, 64, torch.int8, 0, 0.0, torch.float32),
    (8, 1, 1, 128, torch.float8_e4m3fn, 0, 0.0, torch.float32),
    (32, 3, 1, 64, torch.float8_e5m2, 0, 0.0, torch.float32),
    (16, 3, 1, 64, None, 12, 0.0, torch.float32),
    (8, 2, 1, 64, torch.int8, 5, 0.0, torch.float32),
    (16, 2, 1, 64, None, 0, 30.0, torch.float32),
    (16, 2, 2, 64, None, 0, 0.0, torch.bfloat16),
    (16, 3, 1, 128, torch.float8_e4m3fn, 0, 0.0, torch.float16),
]


@pytest.mark.parametrize("bs,gqa,kvh,d,cache_dtype,window,softcap,q_dtype", DECODE_CASES)
def test_paged_decode_attention(bs, gqa, kvh, d, cache_dtype, window, softcap, q_dtype):
    ctx = [0, 9, 40]  # a first token, a partly filled block, several blocks
    q, k, v, tables, lens, starts, ks, vs = make_batch(bs, gqa, kvh, d, [1, 1, 1], ctx,
                                                       cache_dtype, q_dtype)
    out = torch.full_like(q, float("nan"))
    scale = 1 / math.sqrt(d)
    if cache_dtype is None:
        attention.paged_decode_attention(out, q, k, v, tables, lens, scale, window,
                                         softcap=softcap)
    else:
        attention.paged_decode_attention_quant(out, q, k, v, ks, vs, tables, lens, scale,
                                               window, softcap=softcap)
    ref = reference_attention(q, k, v, tables, lens, starts, scale, window, ks, vs, softcap)
    torch.testing.assert_close(out.float(), ref, atol=_tolerance(q_dtype), rtol=0)


@pytest.mark.parametrize("bs,gqa,kvh,d,cache_dtype,window", [
    (16, 1, 2, 64, None, 0),
    (8, 3, 1, 128, torch.int8, 0),
    (32, 8, 1, 64, torch.float8_e4m3fn, 0),
    (16, 3, 1, 64, None, 7),
])
def test_paged_varlen_attention_mixed_batch(bs, gqa, kvh, d, cache_dtype, window):
    """Decodes and prefill chunks in one launch: a fresh prompt, a chunk after cached
    context (chunked prefill / prefix hit), and a decode; queries see keys up to their own
    position."""
    q_lens, ctx = [1, 11, 6], [20, 0, 19]
    q, k, v, tables, lens, starts, ks, vs = make_batch(bs, gqa, kvh, d, q_lens, ctx,
                                                       cache_dtype, seed=1)
    out = torch.full_like(q, float("nan"))
    attention.paged_varlen_attention(out, q, k, v, tables, lens, starts, max(q_lens),
                                     1 / math.sqrt(d), window, ks, vs)
    ref = reference_attention(q, k, v, tables, lens, starts, 1 / math.sqrt(d), window, ks, vs)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=0)


def test_padded_decode_rows_read_nothing():
    """A CUDA-graph batch pads with seq_len 0 rows: they produce zeros, the others are
    unchanged by the padding."""
    q, k, v, tables, lens, starts, _, _ = make_batch(16, 2, 1, 64, [1, 1], [5, 17])
    out = torch.empty_like(q)
    lens[1] = 0
    attention.paged_decode_attention(out, q, k, v, tables, lens, 0.125, 0)
    assert torch.count_nonzero(out[1]) == 0
    ref = reference_attention(q[:1], k, v, tables[:1], lens[:1], starts[:2], 0.125)
    torch.testing.assert_close(out[:1], ref, atol=2e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn, torch.float8_e5m2])
def test_quantize_into_cache_bit_identical(dtype):
    """Values and float16 scales equal kv_quant.quantize bit for bit, over rows from zero
    to 1e3 (fp8 subnormals included); negative slots write nothing."""
    t, kvh, d = 24, 3, 64
    g = torch.Generator().manual_seed(0)
    x = torch.randn(t, kvh, d, generator=g) * torch.logspace(-6, 3, t)[:, None, None]
    x[0] = 0
    x = x.to(DEVICE)
    cache = torch.zeros(8, 8, kvh, d, dtype=dtype, device=DEVICE)
    scales = torch.zeros(8, 8, kvh, dtype=kv_quant.SCALE_DTYPE, device=DEVICE)
    slots = torch.randperm(64, generator=g)[:t].to(DEVICE)
    slots[5] = -1
    kv_write.quantize_into_cache(x, cache, scales, slots)
    values, s = kv_quant.quantize(x, dtype)
    keep = slots >= 0
    stored = kv_quant.raw(cache).view(-1, kvh, d)
    assert torch.equal(stored[slots[keep]], kv_quant.raw(values)[keep])
    assert torch.equal(scales.view(-1, kvh)[slots[keep]], s[keep])
    written = torch.zeros(64, dtype=torch.bool, device=DEVICE)
    written[slots[keep]] = True
    assert torch.count_nonzero(stored[~written]) == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_into_cache(dtype):
    x = torch.randn(5, 3, 64).to(dtype).to(DEVICE)
    cache = torch.zeros(4, 4, 3, 64, dtype=dtype, device=DEVICE)
    slots = torch.tensor([3, 0, -1, 15, 6], device=DEVICE)
    kv_write.write_into_cache(x, cache, slots)
    flat = cache.view(-1, 3, 64)
    assert torch.equal(flat[slots[[0, 1, 3, 4]]], x[[0, 1, 3, 4]])
    assert torch.count_nonzero(flat) == 4 * 3 * 64 - (x[[0, 1, 3, 4]] == 0).sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gemma", [False, True])
def test_fused_add_rms_norm(dtype, gemma):
    hidden = 96  # not a power of two: masked tail
    x = torch.randn(3, hidden).to(dtype).to(DEVICE)
    r = torch.randn(3, hidden).to(dtype).to(DEVICE)
    norm = (GemmaRMSNorm if gemma else RMSNorm)(hidden, 1e-6).to(DEVICE)
    norm.weight.data = torch.randn(hidden).to(dtype).to(DEVICE)
    with torch.no_grad():
        ref_out, ref_res = type(norm).forward(norm, x.clone(), r.clone())  # the torch path
        ref_plain, _ = type(norm).forward(norm, x.clone())
    xs, rs = x.clone(), r.clone()
    fused.add_rms_norm_(xs, rs, norm.weight, 1e-6, gemma=gemma)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(rs, ref_res, atol=0, rtol=0)
    torch.testing.assert_close(xs, ref_out, **tol)
    torch.testing.assert_close(fused.rms_norm(x, norm.weight, 1e-6, gemma=gemma), ref_plain, **tol)


@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_rotary_qk(partial):
    heads, kv_heads, d, t = 3, 1, 64, 4
    rope = RotaryEmbedding(d, {"rope_type": "default", "rope_theta": 10000.0,
                               "partial_rotary_factor": partial}, 512)
    positions = torch.tensor([0, 7, 100, 511])
    halves = rope.halves(positions, 511).to(DEVICE)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, device=DEVICE)
    cos, sin = rope.cos_sin(positions, 511)
    qk = qkv.view(t, -1, d)[:, :heads + kv_heads]
    ref = qkv.clone()
    ref.view(t, -1, d)[:, :heads + kv_heads] = RotaryEmbedding.apply(qk, cos.to(DEVICE),
                                                                     sin.to(DEVICE))
    fused.rotary_qk_(qkv, halves.contiguous(), heads, kv_heads, d)
    torch.testing.assert_close(qkv, ref, atol=1e-5, rtol=1e-5)
