"""KV cache quantizers: round-trip error bounds, float16 scales rounded up, and the C++ write
kernel storing exactly the bits of the torch quantizer."""

from __future__ import annotations

import pytest
import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers import kv_quant

# (dtype, smallest normal |x / scale|, relative error bound in the normal range,
#  absolute bound in units of the scale below it: half the subnormal step)
FP8 = [(torch.float8_e4m3fn, 2.0**-6, 2.0**-4, 2.0**-10),
       (torch.float8_e5m2, 2.0**-14, 2.0**-3, 2.0**-17)]


def _rows(seed: int = 0) -> torch.Tensor:
    """[64, 3, 64] rows spanning 12 orders of magnitude, an outlier channel, an all-zero row,
    a single-spike row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 3, 64, generator=g) * torch.logspace(-6, 6, 64)[:, None, None]
    x[5, :, 3] *= 100.0
    x[7] = 0.0
    x[9] = 0.0
    x[9, 1, 10] = -3.0
    return x


def test_int8_round_trip_within_half_a_step() -> None:
    x = _rows()
    values, scales = kv_quant.quantize(x, torch.int8)
    assert values.dtype == torch.int8 and scales.dtype == torch.float16
    assert scales.shape == x.shape[:-1]
    assert int(values.abs().max()) <= 127 and torch.isfinite(scales.float()).all()
    s = scales.float()
    assert (s >= x.abs().amax(-1) / 127).all()          # rounded up: never saturates
    assert (values.abs().amax(-1)[x.abs().amax(-1) > 1e-3] >= 126).all()  # full range used
    err = (x - kv_quant.dequantize(values, scales, torch.float32)).abs()
    assert (err <= s[..., None] / 2 * (1 + 1e-6)).all()
    assert (kv_quant.dequantize(values, scales, torch.float32)[7] == 0).all()


@pytest.mark.parametrize(("dtype", "normal_min", "rel", "abs_steps"), FP8, ids=str)
def test_fp8_round_trip_relative_bound(dtype, normal_min, rel, abs_steps) -> None:
    x = _rows(1)
    values, scales = kv_quant.quantize(x, dtype)
    assert values.dtype == dtype
    s = scales.float()[..., None]
    assert (s[..., 0] >= x.abs().amax(-1) / kv_quant.QMAX[dtype]).all()
    deq = kv_quant.dequantize(values, scales, torch.float32)
    assert torch.isfinite(deq).all()
    err = (x - deq).abs()
    normal = x.abs() >= normal_min * s
    assert (err[normal] <= rel * x.abs()[normal] * (1 + 1e-6)).all()
    assert (err[~normal] <= abs_steps * s.expand_as(x)[~normal] * (1 + 1e-6)).all()
    # a row's maximum lands at the top of the fp8 range where the scale is a normal float16
    # (a subnormal one is rounded up by more; the relative bound above holds regardless)
    top = values.float().abs().amax(-1)[scales.float() >= 2.0**-14]
    assert len(top) > 10 and (top >= kv_quant.QMAX[dtype] * 0.99).all()


@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=str)
def test_cpu_write_kernel_stores_the_torch_quantizer_bits(dtype) -> None:
    ops = cpu_ops.load()
    if ops is None:
        pytest.skip("CPU kernels unavailable")
    x = _rows(2)
    cache = torch.zeros(12, 8, 3, 64, dtype=dtype)
    scales = torch.zeros(12, 8, 3, dtype=torch.float16)
    slots = torch.randperm(96, generator=torch.Generator().manual_seed(0))[:64]
    ops.quantize_into_cache(x, cache, scales, slots)
    values, s = kv_quant.quantize(x, dtype)
    assert torch.equal(kv_quant.raw(cache).view(-1, 3, 64)[slots], kv_quant.raw(values))
    assert torch.equal(scales.view(-1, 3)[slots], s)
    untouched = torch.ones(96, dtype=torch.bool)
    untouched[slots] = False
    assert (kv_quant.raw(cache).view(-1, 3, 64)[untouched] == 0).all()
    with pytest.raises(RuntimeError, match="out of range"):
        ops.quantize_into_cache(x[:1], cache, scales, torch.tensor([96]))
