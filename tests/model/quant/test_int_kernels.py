"""The int4 (AWQ / GPTQ layout), int8 weight-only and W8A8 kernels against their references:
M = 1, 3, 8, 64, 300 (both the in-register and the scratch path), K and N that are not
multiples of the panel width, K longer than one scratch chunk; the two paths agree bit for bit
(a row's result does not depend on its batch)."""

from __future__ import annotations

import pytest
import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.quant import concat_quantized
from pagedllm.model.layers.quant.int4 import Int4GroupWeight
from pagedllm.model.layers.quant.int8 import Int8Weight, quantize_activations

ops = cpu_ops.load_int()
needs_kernels = pytest.mark.skipif(ops is None, reason="C++ CPU kernels unavailable")
MS = (1, 3, 8, 64, 300)
SHAPES = [(64, 96, 32), (96, 37, 32), (256, 100, 64), (128, 1, 128)]  # (K, N, group size)


def random_int4(n: int, k: int, gs: int, seed: int, perm: bool = False) -> Int4GroupWeight:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    z = torch.randint(0, 16, (n, k // gs), generator=g)
    s = (torch.rand(n, k // gs, generator=g) * 0.1 + 0.01).half()
    return Int4GroupWeight(q, z, s, gs, torch.randperm(k, generator=g) if perm else None)


def ref_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x.double() @ w.double().t()).float()


def assert_close(out, ref, k):
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * k ** 0.5)


@needs_kernels
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize(("k", "n", "gs"), SHAPES)
def test_int4_matches_dequantize_then_matmul(m, k, n, gs):
    w = random_int4(n, k, gs, seed=m + k + n, perm=m == 3)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    assert_close(w.linear(x), ref_linear(x, w.dequantize()), k)


@needs_kernels
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize(("k", "n", "_"), SHAPES)
def test_int8_matches_dequantize_then_matmul(m, k, n, _):
    w = Int8Weight.quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(k + n)))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    assert_close(w.linear(x), ref_linear(x, w.dequantize()), k)


@needs_kernels
@pytest.mark.parametrize("k", [96, 2304 + 64])  # the second spans two scratch chunks
def test_register_and_scratch_paths_agree_bit_for_bit(k):
    n, m = 70, 20
    x = torch.randn(m, k)
    w4 = random_int4(n, k, 32, seed=k)
    w8 = Int8Weight.quantize(torch.randn(n, k))
    for threshold in (0, 10**9):  # 0: always the scratch, huge: always in registers
        y4 = ops.int4_linear(x, w4.qp, w4.zp, w4.sp, n, 32, None, threshold)
        y8 = ops.int8_linear(x, w8.qp, w8.scale, n, None, threshold)
        if threshold == 0:
            s4, s8 = y4, y8
    assert torch.equal(y4, s4) and torch.equal(y8, s8)
    assert_close(s4, ref_linear(x, w4.dequantize()), k)
    # one row alone gives the same bits as inside the batch
    assert torch.equal(w4.linear(x[5:6]), w4.linear(x)[5:6])


def ref_w8a8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """W8A8's definition, written out apart from the module: each 32 values of a row of x
    rounded to int8 with their own scale max|x| / 127, exact integer dot products per block,
    the blocks' scaled sums added in float64, times the weight's channel scale."""
    m, k = x.shape
    out = torch.zeros(m, q.shape[0], dtype=torch.float64)
    for b0 in range(0, k, 32):
        xb = x[:, b0:b0 + 32]
        d = xb.abs().amax(dim=1, keepdim=True) * (1.0 / 127.0)
        xq = torch.round(xb / torch.where(d > 0, d, torch.ones_like(d))).clamp(-127, 127)
        dots = xq.long() @ q[:, b0:b0 + 32].long().t()  # exact
        out += dots.double() * d.double()
    return (out * scale.double()).float()


@needs_kernels
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize(("k", "n", "_"), [*SHAPES, (37, 40, 0), (100, 33, 0)])
def test_w8a8_equals_its_integer_reference(m, k, n, _):
    g = torch.Generator().manual_seed(m * 7 + k)
    w = Int8Weight.quantize(torch.randn(n, k, generator=g), w8a8=True)
    x = torch.randn(m, k, generator=g)
    x[0, 0] = 0.0
    x[0, 33:] = 0.0  # an all-zero block (scale 0) where K has a second one
    if m > 1:
        x[1] = 0.0  # an all-zero row
    out = w.linear(x)
    q, scale = w.unpacked()
    ref = ref_w8a8(x, q, scale)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    torch.testing.assert_close(out, w._torch_linear(x), rtol=1e-6, atol=1e-6)
    # and close to the float product: per-32 int8 rounding only
    exact = ref_linear(x, w.dequantize())
    err = (out - exact).abs().max() / exact.abs().max().clamp_min(1e-6)
    assert err < 0.03
    assert torch.equal(w.linear(x[-1:]), out[-1:])  # batch-invariant


@needs_kernels
def test_w8a8_outlier_rounds_only_its_own_block():
    """One activation 200x the others (the outlier channels of real models), alone in its
    block: with a scale per 32 values the other blocks keep their own fine steps, so the
    result stays within 1% of the float product; one scale per row (the scheme this
    replaced) rounds every other value of the row to steps of 200 / 127."""
    g = torch.Generator().manual_seed(5)
    n, k = 64, 256
    w = Int8Weight.quantize(torch.randn(n, k, generator=g), w8a8=True)
    x = torch.randn(4, k, generator=g)
    x[:, :32] = 0.0
    x[:, 7] = 200.0
    exact = ref_linear(x, w.dequantize())
    rest = exact - ref_linear(x[:, 7:8], w.dequantize()[:, 7:8])  # the non-outlier part
    err = (w.linear(x) - exact).abs().max() / rest.abs().max()
    assert err < 0.01
    q, scale = w.unpacked()
    s = x.abs().amax(dim=1, keepdim=True) / 127
    per_row = ((torch.round(x / s) * s) @ q.float().t()) * scale
    assert (per_row - exact).abs().max() / rest.abs().max() > 10 * err


@needs_kernels
def test_quantize_activations_is_the_kernels_rounding():
    x = torch.randn(4, 50)
    q, d = quantize_activations(x)
    assert q.dtype == torch.int8 and q.shape == (4, 64) and d.shape == (4, 2)
    assert (q[:, 50:] == 0).all()  # the padding of the last block
    assert (q.view(4, 2, 32).abs().amax(dim=2) == 127).all()  # each block uses the full range
    back = (q.view(4, 2, 32).float() * d[..., None]).view(4, 64)[:, :50]
    assert ((back - x).abs() <= d.repeat_interleave(32, dim=1)[:, :50] / 2 + 1e-7).all()
    w = torch.randn(20, 50)
    packed = Int8Weight.quantize(w, w8a8=True)  # codes stored offset for VNNI: same values
    assert torch.equal(packed.unpacked()[0], Int8Weight.quantize(w).unpacked()[0])


@pytest.mark.parametrize("w8a8", [False, True])
def test_int8_linear_layer_with_bias_and_fusion(w8a8):
    torch.manual_seed(3)
    a, b = torch.randn(24, 40), torch.randn(9, 40)
    fused = concat_quantized([Int8Weight.quantize(a, w8a8), Int8Weight.quantize(b, w8a8)])
    assert isinstance(fused, Int8Weight) and fused.shape == (33, 40)
    layer = Linear(40, 33, bias=True)
    layer.bias.data.normal_()
    layer.set_quantized(fused)
    layer.finalize()
    x = torch.randn(2, 5, 40)
    ref = x @ torch.cat([a, b]).t() + layer.bias
    tol = 0.05 if w8a8 else 0.02
    assert (layer(x) - ref).abs().max() < tol * ref.abs().max()
    rows = torch.tensor([3, 0, 30])
    assert torch.equal(fused.embedding(rows), fused.dequantize()[rows])
    padded = -(-33 // fused.nb) * fused.nb  # rows padded to whole panels
    held_k = 64 if w8a8 else 40  # W8A8 pads k to whole 32-value activation blocks
    assert fused.nbytes <= padded * (held_k + 4)  # int8 codes + fp32 scale


def test_torch_fallback_without_kernels(monkeypatch):
    """Without the C++ kernels every format still runs (torch ops, same results)."""
    w4 = random_int4(20, 64, 32, seed=0, perm=True)
    w8 = Int8Weight.quantize(torch.randn(20, 64))
    x = torch.randn(3, 64)
    with_kernels = (w4.linear(x), w8.linear(x))
    monkeypatch.setattr(cpu_ops, "fp32_ops", lambda _x, _family="core": None)
    assert_close(w4.linear(x), with_kernels[0], 64)
    assert_close(w8.linear(x), with_kernels[1], 64)
