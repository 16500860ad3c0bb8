"""GGUF weights with int8 activations (`GGUFA8Weight`): exact values and prefill, and the
int8 path equal to its definition (x rounded per 32 values, then the exact weights)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from pagedllm.model.layers.quant import gguf_a8
from pagedllm.model.layers.quant.gguf_a8 import GGUFA8Weight
from tests.model.quant.test_gguf_formats import TYPES, random_blocks


@pytest.fixture(scope="module", autouse=True)
def _kernels():
    if gguf_a8.kernels() is None:
        pytest.fail("the int8-activation GGUF kernels did not build (cpu_ops.load() failed)")


def quantized_x(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel sees it: per 32 values, d = max|x| / 127, q = round-half-even(x / d)."""
    m, k = x.shape
    blocks = x.view(m, k // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv)
    return (q * (amax / 127.0)).view(m, k)


@pytest.mark.parametrize("qtype", TYPES)
def test_values_and_rows_equal_gguf_py(qtype):
    n, k = 37, 512
    raw = random_blocks(qtype, n, k)
    ref = dequantize(raw, qtype).reshape(n, k).astype(np.float32)
    w = GGUFA8Weight.from_blocks(qtype, raw, (n, k))
    assert w.shape == (n, k) and w.format == f"gguf:{qtype.name}+a8"
    assert w.nbytes == raw.nbytes  # the file's bytes, not a copy more
    np.testing.assert_array_equal(w.dequantize().numpy().view(np.uint32), ref.view(np.uint32))
    ids = torch.tensor([36, 0, 7, 31, 7])
    np.testing.assert_array_equal(w.embedding(ids).numpy(), ref[ids.numpy()])
    order = np.random.default_rng(3).permutation(n)
    permuted = GGUFA8Weight.from_blocks(qtype, raw, (n, k), row_order=order)
    np.testing.assert_array_equal(permuted.dequantize().numpy(), ref[order])


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 3, 4, 7, gguf_a8.INT_ROWS])
def test_int8_rows_equal_their_definition(qtype, m):
    """Up to INT_ROWS rows: y = quantized(x) @ W^T, to fp32 rounding (integer sums are exact,
    only the per-block scale products and the final sum round)."""
    n, k = 45, 768
    raw = random_blocks(qtype, n, k, seed=m)
    w = GGUFA8Weight.from_blocks(qtype, raw, (n, k))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    ref = quantized_x(x).double() @ w.dequantize().double().T
    y = w.linear(x)
    torch.testing.assert_close(y.double(), ref, rtol=2e-5, atol=2e-5 * ref.abs().max().item())
    # ... and close to the exact product: the activation rounding is the only error
    exact = x.double() @ w.dequantize().double().T
    assert (y.double() - exact).abs().max() < 0.02 * exact.abs().max()


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [gguf_a8.INT_ROWS + 1, 64, 300])
def test_many_rows_are_exact(qtype, m):
    """Above INT_ROWS: the exact fp32 product over the dequantized weights (the prefill path)."""
    assert m > gguf_a8.INT_ROWS
    n, k = 70, 256  # 70 rows: a partial last panel
    raw = random_blocks(qtype, n, k, seed=m)
    w = GGUFA8Weight.from_blocks(qtype, raw, (n, k))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    torch.testing.assert_close(w.linear(x), x @ w.dequantize().T, rtol=1e-4, atol=1e-4)


def test_zero_rows_of_x_and_concat():
    raw = random_blocks(T.Q4_1, 48, 256, seed=5)
    a = GGUFA8Weight.from_blocks(T.Q4_1, raw[:32], (32, 256))
    b = GGUFA8Weight.from_blocks(T.Q4_1, raw[32:], (16, 256))
    fused = GGUFA8Weight.concat([a, b])
    whole = GGUFA8Weight.from_blocks(T.Q4_1, raw, (48, 256))
    x = torch.zeros(2, 256)
    x[1, :40] = torch.randn(40)  # a row with all-zero blocks after the first two
    torch.testing.assert_close(fused.linear(x), whole.linear(x), rtol=0, atol=0)
    assert fused.linear(x)[0].abs().max() == 0


def test_bad_shapes_are_clear_errors():
    raw = random_blocks(T.Q4_0, 4, 64)
    with pytest.raises(ValueError, match="bytes per row"):
        GGUFA8Weight.from_blocks(T.Q4_0, raw[:, :-2], (4, 64), name="x")
    w = GGUFA8Weight.from_blocks(T.Q4_0, raw, (4, 64))
    with pytest.raises(RuntimeError, match="contiguous fp32"):
        w.linear(torch.randn(2, 32))
