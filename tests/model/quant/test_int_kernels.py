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


@needs_kernels
@pytest.mark.parametrize("m", MS)
@pytest.mark.parametrize(("k", "n", "_"), SHAPES)
def test_w8a8_equals_its_integer_reference(m, k, n, _):
    g = torch.Generator().manual_seed(m * 7 + k)
    w = Int8Weight.quantize(torch.randn(n, k, generator=g), w8a8=True)
    x = torch.randn(m, k, generator=g)
    x[0, 0] = 0.0
    if m > 1:
        x[1] = 0.0  # an all-zero row (scale 0)
    out = w.linear(x)
    torch.testing.assert_close(out, w._torch_linear(x), rtol=1e-6, atol=1e-6)
    # and close to the float product: per-token int8 rounding only
    exact = ref_linear(x, w.dequantize())
    err = (out - exact).abs().max() / exact.abs().max().clamp_min(1e-6)
    assert err < 0.03
    assert torch.equal(w.linear(x[-1:]), out[-1:])  # batch-invariant


@needs_kernels
def test_quantize_activations_is_the_kernels_rounding():
    x = torch.randn(4, 50)
    q, s = quantize_activations(x)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    torch.testing.assert_close(q.float() * s[:, None], x, atol=float(s.max()) / 2 + 1e-7,
                               rtol=0)


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
    assert fused.nbytes <= padded * (40 + 4 + 4)  # int8 + fp32 scale (+ int32 column sum)


def test_torch_fallback_without_kernels(monkeypatch):
    """Without the C++ kernels every format still runs (torch ops, same results)."""
    w4 = random_int4(20, 64, 32, seed=0, perm=True)
    w8 = Int8Weight.quantize(torch.randn(20, 64))
    x = torch.randn(3, 64)
    with_kernels = (w4.linear(x), w8.linear(x))
    monkeypatch.setattr(cpu_ops, "fp32_ops", lambda _x, _family="core": None)
    assert_close(w4.linear(x), with_kernels[0], 64)
    assert_close(w8.linear(x), with_kernels[1], 64)
