"""A float16 KV cache under fp32 activations (`kv_cache_dtype="float16"`): the new rows are
stored rounded to nearest (torch's `.to(float16)`), and every kernel reading the cache gives,
to the bit, what it gives over an fp32 cache holding those rounded values (float16 -> fp32 is
exact and the arithmetic after it is the same), except where the two take different decode
loops: AVX2 builds keep fp32 rows of head sizes 64 / 128 on the per-token loop and run
float16 rows in tiles (kernels/paged_attention_cpu.cpp, kTiles), which sum in another order.
The torch reference backend agrees within fp32 rounding."""

from __future__ import annotations

import pytest
import torch

from pagedllm.kernels import cpu_features, cpu_ops
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.attention_backends.cpu import CPUBackend
from pagedllm.model.layers.attention_backends.torch_ref import TorchBackend
from tests.model.test_attention import _tables as tables

H, KVH, BS, NBLOCKS = 9, 3, 16, 48


def _kernels() -> CPUBackend:
    if cpu_ops.load() is None:
        pytest.skip("CPU kernels unavailable")
    return CPUBackend("cpu")


def _slot(bt: torch.Tensor, seq: int, pos: int) -> int:
    return int(bt[seq, pos // BS]) * BS + pos % BS


def _assert_equal_loops(out16: torch.Tensor, out32: torch.Tensor, d: int) -> None:
    """Bit for bit where both caches take one decode loop; within fp32 rounding where an AVX2
    build runs the float16 rows in tiles and the fp32 rows per token (module docstring)."""
    if cpu_features.int8_dot_isa() == "avx2" and d in (64, 128):
        torch.testing.assert_close(out16, out32, atol=1e-6, rtol=1e-5)
    else:
        assert torch.equal(out16, out32)


def _run(backend, caches, q, k, v, meta, scale):
    return backend.forward(q, k, v, LayerKVCache(*caches, None, None), meta, scale)


@pytest.mark.parametrize("d", [64, 128, 80])
@pytest.mark.parametrize("window", [None, 24])
def test_fp16_cache_mixed_batch_equals_fp32_of_rounded(d, window):
    """Two decodes (one past 128 tokens: the heads split across threads) and a 40-token
    prefill chunk after 50 cached tokens: the float16 cache ends holding the new rows rounded,
    and the output equals the fp32 cache's over the rounded rows, to the bit; the torch
    backend over the float16 cache is within fp32 rounding of it."""
    backend = _kernels()
    torch.manual_seed(d)
    lens = [9, 150, 90]                      # decode, decode, prefill (50 cached + 40 new)
    bt = tables(lens, BS, NBLOCKS)
    new_pos = [[8], [149], list(range(50, 90))]
    slots = torch.tensor([_slot(bt, i, p) for i, ps in enumerate(new_pos) for p in ps])
    t = len(slots)
    k_pool = torch.randn(NBLOCKS, BS, KVH, d) * 3
    v_pool = torch.randn(NBLOCKS, BS, KVH, d)
    k_new, v_new = torch.randn(t, KVH, d) * 3, torch.randn(t, KVH, d)
    q = torch.randn(t, H, d)
    meta = AttentionMetadata(
        slot_mapping=slots, num_decodes=2, decode_block_tables=bt[:2],
        decode_seq_lens=torch.tensor(lens[:2]), sliding_window=window,
        prefill_block_tables=bt[2:], prefill_query_start=torch.tensor([0, 40]),
        prefill_seq_lens=torch.tensor(lens[2:]))
    scale = d ** -0.5
    half = [k_pool.half(), v_pool.half()]
    rounded = [p.float() for p in half]
    threads = torch.get_num_threads()
    try:  # 3 threads: the 150-token decode alone would split its heads
        torch.set_num_threads(3)
        out16 = _run(backend, half, q, k_new, v_new, meta, scale)
        out32 = _run(backend, rounded, q, k_new.half().float(), v_new.half().float(), meta,
                     scale)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(half[0].view(-1, KVH, d)[slots], k_new.half())
    assert torch.equal(half[1].view(-1, KVH, d)[slots], v_new.half())
    _assert_equal_loops(out16, out32, d)
    ref_half = [k_pool.half(), v_pool.half()]
    ref = _run(TorchBackend("cpu"), ref_half, q, k_new, v_new, meta, scale)
    torch.testing.assert_close(out16, ref, atol=3e-5, rtol=1e-4)
    assert torch.equal(ref_half[0], half[0]) and torch.equal(ref_half[1], half[1])


@pytest.mark.parametrize("d", [64, 128])
def test_fp16_cache_fused_qkv_decode(d):
    """The decode-only step's one call (paged_decode_attention_qkv: write the rows, attend
    reading q in place) over a float16 cache equals the fp32 cache's over the rounded rows."""
    backend = _kernels()
    torch.manual_seed(1)
    lens = [1, 17, 64, 200]
    bt = tables(lens, BS, NBLOCKS)
    slots = torch.tensor([_slot(bt, i, n - 1) for i, n in enumerate(lens)])
    k_pool = torch.randn(NBLOCKS, BS, KVH, d)
    v_pool = torch.randn(NBLOCKS, BS, KVH, d)
    qkv = torch.randn(len(lens), (H + 2 * KVH) * d)
    meta = AttentionMetadata(
        slot_mapping=slots, num_decodes=len(lens), decode_block_tables=bt,
        decode_seq_lens=torch.tensor(lens), sliding_window=None, prefill_block_tables=None)
    half = [k_pool.half(), v_pool.half()]
    out16 = backend.forward_qkv(qkv, H, KVH, d, LayerKVCache(*half, None, None), meta,
                                d ** -0.5)
    rounded = qkv.clone()
    rounded[:, H * d:] = rounded[:, H * d:].half().float()
    out32 = backend.forward_qkv(rounded, H, KVH, d,
                                LayerKVCache(k_pool.half().float(), v_pool.half().float(),
                                             None, None), meta, d ** -0.5)
    _assert_equal_loops(out16, out32, d)
    k_rows = qkv[:, H * d:(H + KVH) * d].reshape(-1, KVH, d)
    assert torch.equal(half[0].view(-1, KVH, d)[slots], k_rows.half())


def test_fp16_engine_greedy_matches_fp32_cache(tiny_llama_dir, make_llm):
    """An engine with kv_cache_dtype='float16' generates (greedy) what the fp32-cache engine
    does on the tiny Llama (prefill, decode and the fused decode loop over the float16
    cache), with half the KV bytes per token."""
    from pagedllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = [[1, 5, 9, 22, 7], list(range(3, 40))]
    outs, per_token = {}, {}
    for dtype in ("auto", "float16"):
        llm = make_llm(tiny_llama_dir, kv_cache_dtype=dtype, enable_prefix_caching=False)
        outs[dtype] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
        per_token[dtype] = llm.llm_engine.kv_spec.bytes_per_token
    assert outs["float16"] == outs["auto"]
    assert per_token["float16"] * 2 == per_token["auto"]
