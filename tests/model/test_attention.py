"""Paged attention: the C++ CPU backend's decode kernel and the torch reference backend agree
with a dense reference, for fp32 caches and for int8 / fp8 caches (against the dequantized
values)."""

from __future__ import annotations

import pytest
import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers import kv_quant
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.attention_backends.cpu import CPUBackend
from pagedllm.model.layers.attention_backends.torch_ref import TorchBackend


def _backend(kernels: bool):
    """The C++ CPU backend (skipped where the kernels are unavailable) or the torch one."""
    if not kernels:
        return TorchBackend("cpu")
    if cpu_ops.load() is None:
        pytest.skip("CPU kernels unavailable")
    return CPUBackend("cpu")


def paged_attention(backend, q, k, v, k_cache, v_cache, meta, scale, k_scale=None,
                    v_scale=None):
    return backend.forward(q, k, v, LayerKVCache(k_cache, v_cache, k_scale, v_scale), meta,
                           scale)


def _dense_reference(q, ks, vs, scale, window=None):
    """q [H, d] against ks/vs [L, kvh, d] of one sequence (last position = L-1)."""
    h, d = q.shape
    kvh = ks.shape[1]
    k = ks.repeat_interleave(h // kvh, dim=1).transpose(0, 1)   # [H, L, d]
    v = vs.repeat_interleave(h // kvh, dim=1).transpose(0, 1)
    s = (q[:, None, :] @ k.transpose(1, 2)).squeeze(1).double() * scale  # [H, L]
    if window is not None:
        L = ks.shape[0]
        s[:, : max(0, L - window)] = float("-inf")
    p = torch.softmax(s, -1).float()
    return (p[:, None, :] @ v).squeeze(1)


def _last_slots(bt, lens, block_size):
    """Slot of each sequence's last (new) token."""
    return torch.tensor([bt[i, (L - 1) // block_size] * block_size + (L - 1) % block_size
                         for i, L in enumerate(lens)])


def _decode_meta(bt, lens, block_size, slots, window):
    """Metadata of a decode-only batch: one new token per sequence at `slots` (the torch
    path derives the key mask from the lengths and the window)."""
    seq = torch.tensor(lens)
    return AttentionMetadata(
        slot_mapping=slots, num_decodes=len(lens), decode_block_tables=bt,
        decode_seq_lens=seq, sliding_window=window,
        prefill_block_tables=None)


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("use_kernel", [True, False])
@pytest.mark.parametrize("window", [None, 20])
def test_decode_matches_dense(block_size, use_kernel, window):
    backend = _backend(use_kernel)
    torch.manual_seed(0)
    h, kvh, d, nblocks = 6, 2, 16, 64
    k_cache = torch.randn(nblocks, block_size, kvh, d)
    v_cache = torch.randn(nblocks, block_size, kvh, d)
    lens = [1, 7, 33, 70]
    bt = _tables(lens, block_size, nblocks)
    q = torch.randn(len(lens), h, d)
    # New tokens' K/V are written at their slots first: use what is already there.
    slots = _last_slots(bt, lens, block_size)
    k_new = k_cache.view(-1, kvh, d)[slots].clone()
    v_new = v_cache.view(-1, kvh, d)[slots].clone()
    meta = _decode_meta(bt, lens, block_size, slots, window)
    scale = d ** -0.5
    out = paged_attention(backend, q, k_new, v_new, k_cache, v_cache, meta,
                          scale).view(len(lens), h, d)
    for i, L in enumerate(lens):
        ks = _context(k_cache, bt[i], L, block_size)
        vs = _context(v_cache, bt[i], L, block_size)
        ref = _dense_reference(q[i], ks, vs, scale, window)
        torch.testing.assert_close(out[i], ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8], ids=str)
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("d", [64, 128, 256, 80])
def test_kernel_decode_alone_equals_batched(dtype, window, d):
    """The C++ kernel splits one sequence across threads (fewer sequences than threads: by
    chunks of its tokens and KV heads, or whole chunks once they are many) and a batch by
    sequence: each sequence decoded alone equals, to the bit, its row of the batched call, and
    the dense reference."""
    ops = cpu_ops.load()
    if ops is None:
        pytest.skip("CPU kernels unavailable")
    torch.manual_seed(0)
    h, kvh, nblocks, block_size = 9, 3, 128, 16
    lens = [1, 7, 33, 70, 150, 300, 700]  # from 128 tokens alone: split (700: whole chunks)
    bt = _tables(lens, block_size, nblocks)
    q = torch.randn(len(lens), h, d)
    seq = torch.tensor(lens)
    scale = d ** -0.5
    pools = [torch.randn(nblocks, block_size, kvh, d).to(dtype if dtype.is_floating_point
                                                         else torch.float32) for _ in range(2)]
    if dtype.is_floating_point:
        def run(rows):
            out = torch.empty(len(rows), h, d)
            ops.paged_decode_attention(out, q[rows].contiguous(), *pools, bt[rows].contiguous(),
                                       seq[rows].contiguous(), scale, window or 0)
            return out
        deq = [p.float() for p in pools]
    else:
        quant = [kv_quant.quantize(x, dtype) for x in pools]
        deq = [kv_quant.dequantize(v, s, torch.float32) for v, s in quant]
        def run(rows):
            out = torch.empty(len(rows), h, d)
            ops.paged_decode_attention_quant(
                out, q[rows].contiguous(), quant[0][0], quant[1][0], quant[0][1], quant[1][1],
                bt[rows].contiguous(), seq[rows].contiguous(), scale, window or 0)
            return out
    threads = torch.get_num_threads()
    try:  # 3 threads: a long sequence alone is split, the batch of 7 goes by sequence
        torch.set_num_threads(3)
        batched = run(list(range(len(lens))))
        alone = [run([i])[0] for i in range(len(lens))]
        pair = run([5, 6])  # fewer rows than threads, both split: items of two sequences
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(pair[0], alone[5]) and torch.equal(pair[1], alone[6])
    for i, L in enumerate(lens):
        assert torch.equal(alone[i], batched[i]), f"sequence {i} alone != batched"
        ref = _dense_reference(q[i], _context(deq[0], bt[i], L, block_size),
                               _context(deq[1], bt[i], L, block_size), scale, window)
        torch.testing.assert_close(batched[i], ref, atol=2e-5, rtol=1e-4)


# ------------------------------------------------------------- int8 / fp8 caches

QUANT_DTYPES = [torch.int8, torch.float8_e4m3fn, torch.float8_e5m2]


def _quantized_pools(nblocks, block_size, kvh, d, dtype, seed=0):
    """Random fp32 pools, their quantized (values, scales) and the dequantized fp32 pools."""
    torch.manual_seed(seed)
    pools = []
    for _ in range(2):
        x = torch.randn(nblocks, block_size, kvh, d) * torch.rand(nblocks, block_size, kvh, 1) * 4
        values, scales = kv_quant.quantize(x, dtype)
        pools.append((x, values, scales, kv_quant.dequantize(values, scales, torch.float32)))
    return pools


def _tables(lens, block_size, nblocks):
    perm = torch.randperm(nblocks).tolist()
    tables, used = [], 0
    for L in lens:
        nb = -(-L // block_size)
        tables.append(perm[used:used + nb])
        used += nb
    width = max(map(len, tables))
    return torch.tensor([t + [0] * (width - len(t)) for t in tables])


def _context(pool, bt_row, L, block_size):
    pos = torch.arange(L)
    flat = bt_row[pos // block_size] * block_size + pos % block_size
    return pool.view(-1, *pool.shape[2:])[flat]


@pytest.mark.parametrize("dtype", QUANT_DTYPES, ids=str)
@pytest.mark.parametrize("use_kernel", [True, False])
@pytest.mark.parametrize("window", [None, 20])
def test_quantized_decode_matches_dense(dtype, use_kernel, window):
    """C++ kernel and torch path (gather + dequantize + SDPA) both equal a dense attention
    over the dequantized cache, and stay near the one over the original fp32 values."""
    backend = _backend(use_kernel)
    h, kvh, d, nblocks, block_size = 6, 2, 64, 64, 16
    (k_x, k_q, k_s, k_deq), (v_x, v_q, v_s, v_deq) = _quantized_pools(
        nblocks, block_size, kvh, d, dtype)
    lens = [1, 7, 33, 70, 150]
    bt = _tables(lens, block_size, nblocks)
    q = torch.randn(len(lens), h, d)
    slots = _last_slots(bt, lens, block_size)
    # The new tokens are the original rows at their slots: writing re-quantizes them to
    # exactly the values already stored.
    k_new, v_new = k_x.view(-1, kvh, d)[slots], v_x.view(-1, kvh, d)[slots]
    meta = _decode_meta(bt, lens, block_size, slots, window)
    scale = d ** -0.5
    k_cache, v_cache, k_scale, v_scale = k_q.clone(), v_q.clone(), k_s.clone(), v_s.clone()
    out = paged_attention(backend, q, k_new, v_new, k_cache, v_cache, meta, scale, k_scale,
                          v_scale).view(len(lens), h, d)
    assert torch.equal(kv_quant.raw(k_cache), kv_quant.raw(k_q)) and torch.equal(k_scale, k_s)
    loose = {torch.int8: 0.02, torch.float8_e4m3fn: 0.1, torch.float8_e5m2: 0.2}[dtype]
    for i, L in enumerate(lens):
        ref = _dense_reference(q[i], _context(k_deq, bt[i], L, block_size),
                               _context(v_deq, bt[i], L, block_size), scale, window)
        torch.testing.assert_close(out[i], ref, atol=2e-5, rtol=1e-4)
        exact = _dense_reference(q[i], _context(k_x, bt[i], L, block_size),
                                 _context(v_x, bt[i], L, block_size), scale, window)
        assert (out[i] - exact).abs().max() < loose * exact.abs().max()


@pytest.mark.parametrize("dtype", QUANT_DTYPES, ids=str)
@pytest.mark.parametrize("kernels", [True, False])
def test_quantized_prefill_and_decode_batch(dtype, kernels):
    """A mixed batch (2 decodes + a 5-token prefill chunk after 11 cached tokens) writes the
    new rows quantized and attends over the dequantized cache, with or without C++ kernels
    (the write goes through `quantize_into_cache` or torch ops; the same bits either way)."""
    backend = _backend(kernels)
    h, kvh, d, nblocks, block_size = 4, 2, 32, 16, 8
    (k_x, k_q, k_s, _), (v_x, v_q, v_s, _) = _quantized_pools(nblocks, block_size, kvh, d,
                                                              dtype, seed=1)
    lens = [9, 20, 16]                   # decode, decode, prefill (ctx_start 11, 5 new)
    bt = _tables(lens, block_size, nblocks)
    new_pos = [[8], [19], list(range(11, 16))]
    slots = torch.tensor([int(bt[i, p // block_size]) * block_size + p % block_size
                          for i, ps in enumerate(new_pos) for p in ps])
    k_new, v_new = k_x.view(-1, kvh, d)[slots].clone(), v_x.view(-1, kvh, d)[slots].clone()
    # Start from a cache whose new slots hold garbage: the write must fill values and scales.
    k_cache, v_cache, k_scale, v_scale = k_q.clone(), v_q.clone(), k_s.clone(), v_s.clone()
    for pool in (kv_quant.raw(k_cache), kv_quant.raw(v_cache)):
        pool.view(-1, kvh, d)[slots] = 7
    k_scale.view(-1, kvh)[slots] = 0
    t = len(slots)
    q = torch.randn(t, h, d)
    dec_seq = torch.tensor(lens[:2])
    meta = AttentionMetadata(
        slot_mapping=slots, num_decodes=2, decode_block_tables=bt[:2],
        decode_seq_lens=dec_seq, sliding_window=None, prefill_block_tables=bt[2:],
        prefill_query_start=torch.tensor([0, 5]), prefill_seq_lens=torch.tensor([16]))
    scale = d ** -0.5
    out = paged_attention(backend, q, k_new, v_new, k_cache, v_cache, meta, scale, k_scale,
                          v_scale).view(t, h, d)
    assert torch.equal(kv_quant.raw(k_cache), kv_quant.raw(k_q))
    assert torch.equal(kv_quant.raw(v_cache), kv_quant.raw(v_q))
    assert torch.equal(k_scale, k_s) and torch.equal(v_scale, v_s)
    k_deq = kv_quant.dequantize(k_q, k_s, torch.float32)
    v_deq = kv_quant.dequantize(v_q, v_s, torch.float32)
    queries = [(0, 0, 9), (1, 1, 20)] + [(2 + j, 2, 12 + j) for j in range(5)]
    for row, seq, L in queries:
        ref = _dense_reference(q[row], _context(k_deq, bt[seq], L, block_size),
                               _context(v_deq, bt[seq], L, block_size), scale)
        torch.testing.assert_close(out[row], ref, atol=2e-5, rtol=1e-4)
