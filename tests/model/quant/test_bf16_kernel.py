"""The bf16-weight linear layer (kernels/bf16_linear_cpu.cpp, model/layers/quant/bf16.py)
against its references, at the shapes the models use (K 576 / 960 / 1536 / 2048, N up to the
49152-row lm_head of SmolLM2) and odd N / K tails:

    M < torch_rows    fp32 x times the weight widened to fp32 (fp64 reference, fp32 bound)
    M >= torch_rows   torch's bf16 matmul of x rounded to bf16, widened (equal to the bit)

and batch-invariant below torch_rows (a row's output does not depend on the rows beside it).
"""

from __future__ import annotations

import pytest
import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.quant.bf16 import TORCH_ROWS, Bf16Weight

ops = cpu_ops.load()
pytestmark = pytest.mark.skipif(ops is None, reason="no C++ CPU kernels (PAGEDLLM_NO_CPU_KERNELS)")

SHAPES = [(1536, 576), (576, 1536), (960, 576), (2048, 2048), (192, 960), (49152, 576),
          (37, 19), (5, 33), (131, 100)]  # the last three: N % 4 and K % 16 tails


def weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) / k**0.5).to(torch.bfloat16)


def assert_fp32_close(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor,
                      bias: torch.Tensor | None = None) -> None:
    """Equal to x @ W^T in fp64 within fp32 accumulation error: |err| <= 1e-5 sum |x w|."""
    wd = w.double()
    ref = x.double() @ wd.t()
    if bias is not None:
        ref = ref + bias.double()
    bound = 1e-5 * (x.double().abs() @ wd.abs().t()) + 1e-30
    assert got.dtype == torch.float32 and got.shape == ref.shape
    assert ((got.double() - ref).abs() <= bound).all(), (got.double() - ref).abs().max()


@pytest.mark.parametrize("n,k", SHAPES)
def test_small_rows_equal_the_widened_fp32_matmul(n: int, k: int) -> None:
    w = weight(n, k)
    rows = range(1, 16) if n * k < 10**7 else (1, 2, 7, 15)
    for m in rows:
        x = torch.randn(m, k)
        assert_fp32_close(ops.bf16_linear(x, w, None, 16), x, w)


def test_bias_and_the_torch_branch() -> None:
    w, bias = weight(96, 64), torch.randn(96)
    small = torch.randn(TORCH_ROWS - 1, 64)
    assert_fp32_close(ops.bf16_linear(small, w, bias, TORCH_ROWS), small, w, bias)
    for m in (TORCH_ROWS, 16, 40):
        x = torch.randn(m, 64)
        expected = torch.nn.functional.linear(x.to(torch.bfloat16), w).float() + bias
        assert torch.equal(ops.bf16_linear(x, w, bias, TORCH_ROWS), expected)


def test_rows_are_batch_invariant_below_torch_rows() -> None:
    w = weight(300, 1000)
    x = torch.randn(15, 1000)
    whole = ops.bf16_linear(x, w, None, 16)
    for m in range(1, 16):
        assert torch.equal(ops.bf16_linear(x[:m].contiguous(), w, None, 16), whole[:m])
    assert torch.equal(ops.bf16_linear(x[7:8].contiguous(), w, None, 16), whole[7:8])


def test_method_follows_the_contract_with_and_without_kernels() -> None:
    w32 = torch.randn(70, 48)
    method = Bf16Weight(ops, w32)
    assert method.weight.dtype == torch.bfloat16 and method.nbytes == 70 * 48 * 2
    assert torch.equal(method.dequantize(), w32.to(torch.bfloat16).float())
    x = torch.randn(2, 3, 48)  # leading dims kept; fewer rows than torch_rows: the kernel
    assert_fp32_close(method.apply(x, None).reshape(6, 70), x.reshape(6, 48), method.weight)
    assert method.apply(x, None).shape == (2, 3, 70)
    plain = Bf16Weight(None, w32)  # no kernels: torch's bf16 matmul at every row count
    x = torch.randn(3, 48)
    assert torch.equal(plain.apply(x, None),
                       torch.nn.functional.linear(x.to(torch.bfloat16), plain.weight).float())
    with pytest.raises(ValueError, match="torch_rows"):
        Bf16Weight(ops, w32, torch_rows=0)


def test_bad_inputs_are_refused() -> None:
    w = weight(8, 16)
    with pytest.raises(RuntimeError, match="bf16_linear"):
        ops.bf16_linear(torch.randn(2, 15), w, None, 16)  # K mismatch
    with pytest.raises(RuntimeError, match="bf16_linear"):
        ops.bf16_linear(torch.randn(2, 16), w.float(), None, 16)  # not bf16
    assert ops.bf16_linear_isa() in ("avx512", "avx2", "scalar")
