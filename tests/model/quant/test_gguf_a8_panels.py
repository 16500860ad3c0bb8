"""GGUF Q8_0 / Q4_0 / Q4_1 / Q4_K (and Q5_0, as Q8_0) with int8 activations in panels (`GGUFA8PanelWeight`, integer dot
products at every M): exact values and rows, the product equal to its definition (x rounded
per 32 values, then the exact weights), batch invariance, fusion, and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from pagedllm.model.layers.quant import concat_quantized, gguf_a8_panels
from pagedllm.model.layers.quant.gguf_a8_panels import PANEL_TYPES, GGUFA8PanelWeight
from tests.model.quant.test_gguf_formats import random_blocks, whole_k


@pytest.fixture(scope="module", autouse=True)
def _kernels():
    if gguf_a8_panels.kernels() is None:
        pytest.fail("the int8-activation panel kernels did not build (cpu_ops.load() failed)")


def quantized_x(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel sees it: per 32 values, d = max|x| / 127, q = round-half-even(x / d)."""
    m, k = x.shape
    blocks = x.view(m, k // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv)
    return (q * (amax / 127.0)).view(m, k)


@pytest.mark.parametrize("qtype", PANEL_TYPES)
def test_values_rows_and_bytes_equal_the_file(qtype):
    n, k = 45, 256  # 45 rows: a partial last panel
    raw = random_blocks(qtype, n, k)
    ref = dequantize(raw, qtype).reshape(n, k).astype(np.float32)
    w = GGUFA8PanelWeight.from_blocks(qtype, raw, (n, k))
    stored = T.Q8_0 if qtype == T.Q5_0 else qtype  # Q5_0's codes in Q8_0's panels
    assert w.shape == (n, k) and w.format == f"gguf:{stored.name}+a8"
    panel = w.codes.shape[3]
    # a 32-value block's bytes: the file's; Q4_K's sub-block 16 code bytes and fp32 d, m;
    # Q6_K's 32 code bytes and two fp32 scales
    block_bytes = {T.Q4_K: 24, T.Q6_K: 40}.get(qtype, GGML_QUANT_SIZES[stored][1])
    assert w.nbytes == -(-n // panel) * panel * (k // 32) * block_bytes  # + padding rows
    np.testing.assert_array_equal(w.dequantize().numpy().view(np.uint32), ref.view(np.uint32))
    ids = torch.tensor([44, 0, 7, 31, 7])
    np.testing.assert_array_equal(w.embedding(ids).numpy(), ref[ids.numpy()])  # C++ rows
    np.testing.assert_array_equal(w.embedding_reference(ids).numpy(), ref[ids.numpy()])
    order = np.random.default_rng(3).permutation(n)
    permuted = GGUFA8PanelWeight.from_blocks(qtype, raw, (n, k), row_order=order)
    np.testing.assert_array_equal(permuted.dequantize().numpy(), ref[order])
    for bad in (45, -1):
        with pytest.raises(IndexError, match=r"\[0, 45\)"):
            w.embedding(torch.tensor([3, bad]))
        with pytest.raises(IndexError, match=r"\[0, 45\)"):
            w.embedding_reference(torch.tensor([3, bad]))


@pytest.mark.parametrize("qtype", PANEL_TYPES)
@pytest.mark.parametrize("m", [1, 2, 3, 7, 8, 13, 64, 300])
@pytest.mark.parametrize("n,k", [(70, 256), (33, 96), (512, 1536)])
def test_product_equals_its_definition(qtype, m, n, k):
    """y = quantized(x) @ W^T to fp32 rounding (integer sums exact, the per-block scale products
    and the sum over blocks round) for partial panels and K of a few blocks, and close to the
    exact product (the activation rounding is the only error)."""
    k = whole_k(qtype, k)
    raw = random_blocks(qtype, n, k, seed=m + n)
    w = GGUFA8PanelWeight.from_blocks(qtype, raw, (n, k))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 3
    x[0, : k // 2] = 0  # all-zero blocks (scale 0)
    y = w.linear(x)
    dense = w.dequantize().double()
    ref = quantized_x(x).double() @ dense.T
    tol = 2e-5 * ref.abs().max().item()
    torch.testing.assert_close(y.double(), ref, rtol=2e-5, atol=tol)
    exact = x.double() @ dense.T
    assert (y.double() - exact).abs().max() < 0.02 * exact.abs().max()


@pytest.mark.parametrize("qtype", PANEL_TYPES)
@pytest.mark.parametrize("threads", [1, 2])
def test_rows_do_not_depend_on_the_batch(qtype, threads):
    """A row's output is the same bits alone or in any batch: 67 rows (the threads split the
    panels) and 300 (on 2 threads, 128 rows a thread and more: each takes half of the rows,
    every panel), sliced across the 150-row boundary of that split."""
    raw = random_blocks(qtype, 100, 512, seed=9)
    w = GGUFA8PanelWeight.from_blocks(qtype, raw, (100, 512))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows, slices in [(67, [(0, 1), (5, 8), (3, 16), (60, 67)]),
                             (300, [(0, 7), (145, 156), (149, 151), (290, 300), (0, 67)])]:
            x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
            y = w.linear(x)
            for lo, hi in slices:
                assert torch.equal(w.linear(x[lo:hi].contiguous()), y[lo:hi]), (rows, lo, hi)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("qtype", PANEL_TYPES)
def test_concat_and_mixed_fusion(qtype):
    k = whole_k(qtype, 128)
    raw = random_blocks(qtype, 90, k, seed=5)
    parts = [GGUFA8PanelWeight.from_blocks(qtype, raw[a:b], (b - a, k))
             for a, b in [(0, 37), (37, 90)]]
    fused = concat_quantized(parts)
    whole = GGUFA8PanelWeight.from_blocks(qtype, raw, (90, k))
    assert type(fused) is GGUFA8PanelWeight and fused.nbytes == whole.nbytes
    x = torch.randn(5, k)
    assert torch.equal(fused.linear(x), whole.linear(x))
    other_type = T.Q8_0 if qtype == T.Q6_K else T.Q6_K  # another format
    other = GGUFA8PanelWeight.from_blocks(other_type, random_blocks(other_type, 16, 256),
                                          (16, 256))
    x = torch.randn(5, 256)
    left = GGUFA8PanelWeight.from_blocks(qtype, random_blocks(qtype, 16, 256), (16, 256))
    mixed = concat_quantized([left, other])  # two formats (a q and a k): side by side
    torch.testing.assert_close(mixed.linear(x), torch.cat([left.linear(x), other.linear(x)], 1))


def test_bad_input_is_a_clear_error():
    raw = random_blocks(T.Q8_0, 4, 64)
    with pytest.raises(ValueError, match="bytes per row"):
        GGUFA8PanelWeight.from_blocks(T.Q8_0, raw[:, :-2], (4, 64), name="x")
    with pytest.raises(ValueError, match="Q5_K has no panel kernel"):
        GGUFA8PanelWeight.from_blocks(T.Q5_K, np.zeros((4, 176), np.uint8), (4, 256))
    w = GGUFA8PanelWeight.from_blocks(T.Q8_0, raw, (4, 64))
    with pytest.raises(RuntimeError, match="contiguous fp32"):
        w.linear(torch.randn(2, 64).t())
    with pytest.raises(RuntimeError, match="codes must be"):
        w.linear(torch.randn(2, 32))


@pytest.mark.parametrize("gate_up_type,down_type", [(T.Q4_1, T.Q4_1), (T.Q4_0, T.Q8_0),
                                                    (T.Q8_0, T.Q4_0)])
@pytest.mark.parametrize("threads", [1, 2])
def test_mlp_in_one_call_is_the_three_calls(gate_up_type, down_type, threads):
    """`a8_panel_mlp` (gate_up, SiLU and the down projection's quantized input in one parallel
    region) gives the bits of linear, silu_mul, linear: decode batches (the threads split the
    32-value blocks), 300 rows (on 2 threads each takes its rows), a partial row chunk."""
    hidden, inter = 160, 320  # 10 blocks of the down input: the threads split 5 / 5
    gate_up = GGUFA8PanelWeight.from_blocks(
        gate_up_type, random_blocks(gate_up_type, 2 * inter, hidden, seed=1), (2 * inter, hidden))
    down = GGUFA8PanelWeight.from_blocks(
        down_type, random_blocks(down_type, hidden, inter, seed=2), (hidden, inter))
    ops = gguf_a8_panels.kernels()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for rows in (1, 7, 64, 100, 300):
            x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(rows)) * 0.2
            ref = down.linear(ops.silu_mul(gate_up.linear(x)))
            y = gate_up.gated_mlp(down, x)
            assert y is not None and torch.isfinite(ref).all()
            assert torch.equal(y.view(torch.int32), ref.view(torch.int32)), rows
    finally:
        torch.set_num_threads(before)


def test_mlp_in_one_call_only_where_it_applies():
    """The layer runs the fused kernel only for two plain panel layers (no bias, `down` a
    Linear of its own, not wrapped) of matching sizes; the kernel itself names a bad shape."""
    from pagedllm.model.layers.linear import Linear

    def panels(n, k, seed):
        return GGUFA8PanelWeight.from_blocks(T.Q8_0, random_blocks(T.Q8_0, n, k, seed=seed), (n, k))

    gate_up, down = Linear(64, 128), Linear(64, 64)
    gate_up.set_quantized(panels(128, 64, 1))
    down.set_quantized(panels(64, 64, 2))
    x = torch.randn(3, 64)
    h = gate_up(x)
    ref = down(torch.nn.functional.silu(h[:, :64]) * h[:, 64:])
    torch.testing.assert_close(gate_up.gated_mlp(down, x), ref, rtol=1e-5, atol=1e-4)
    assert gate_up.gated_mlp(torch.nn.Identity(), x) is None  # a wrapper (LoRA's) is not a Linear
    biased = Linear(64, 64, bias=True)
    biased.set_quantized(panels(64, 64, 3))
    assert gate_up.gated_mlp(biased, x) is None
    other_up = Linear(64, 96)  # [gate | up] of 48 columns each, down takes 64
    other_up.set_quantized(panels(96, 64, 4))
    assert other_up.gated_mlp(down, x) is None
    ops = gguf_a8_panels.kernels()
    g, d = gate_up.method, down.method
    with pytest.raises(RuntimeError, match="whole 32-value blocks"):
        ops.a8_panel_mlp(x, g.code, g.codes, g.d, g.m, d.code, d.codes, d.d, d.m, 48, 64)
    with pytest.raises(RuntimeError, match=r"a8_panel_mlp \(down\)"):
        ops.a8_panel_mlp(x, g.code, g.codes, g.d, g.m, d.code, d.codes, d.d, d.m, 64, 32)
