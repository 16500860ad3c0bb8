"""8-bit KV cache: int8 or fp8 values with one float16 scale per token per KV head.

    values  [layers, 2, num_blocks, block_size, kv_heads, head_dim]   int8 | fp8
    scales  [layers, 2, num_blocks, block_size, kv_heads]             float16
    x[slot, head, :]  ~=  values[slot, head, :] * scales[slot, head]

The scale pool is indexed by the same (block, offset) as the values, so everything that
moves blocks (copy-on-write copies, swaps) moves both, and blocks shared by the prefix
cache share their scales for free.

Quantization happens once, when a token's K/V is written to its slot; attention
dequantizes on read (the C++ decode kernel converts each cached row to fp32 in registers;
the torch path gathers, then multiplies by the scales).

* int8: symmetric, ``scale = max|x| / 127`` over the row's head_dim values,
  ``q = round(x / scale)`` in [-127, 127]. Per element ``|x - q * scale| <= scale / 2``.
* fp8 (``float8_e4m3fn``, ``float8_e5m2``): the same dynamic per-token-per-head scale,
  ``scale = max|x| / fp8_max`` (448 or 57344), ``q = fp8(x / scale)`` rounded to nearest.
  Relative error per element <= 2^-4 (e4m3, 3 mantissa bits) or 2^-3 (e5m2) for values in
  the normal range; rows never saturate.

Why dynamic per-token-per-head scales for fp8 rather than one per-tensor scale: a static
scale needs calibration data (vLLM reads it from the checkpoint or defaults to 1.0), and
one scale per layer wastes fp8's few exponent steps on the spread between heads and tokens
(a few K channels are much larger than the rest). A per-row scale puts every row's largest
value at the top of the fp8 range, needs no calibration, costs 2 bytes per head_dim values
(3% at head_dim 64), and shares the scale pool, write path and kernel with int8.

Why float16 scales: with float32 scales SmolLM2's 64-value rows cost 64 + 4 bytes instead
of 256 (3.76x the fp32 capacity); float16 gives 64 + 2 (3.88x). The scale is rounded *up*
to float16, and quantization divides by the stored float16 value, so the bounds above hold
exactly with the scale actually stored. Scales are clamped to [2^-24, 65504]: only rows
with max|x| above 8.3e6 (int8) would saturate. e5m2 scales of rows with max|x| < 3.5 are
float16 subnormals and round up by more than 0.1%; that leaves some of e5m2's range unused
but does not change its relative precision.
"""

from __future__ import annotations

import torch

SCALE_DTYPE = torch.float16
_SCALE_MIN = 2.0**-24      # smallest float16 subnormal: an all-zero row gets a finite scale
_SCALE_MAX = 65504.0       # largest float16
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def is_quantized(dtype: torch.dtype) -> bool:
    """True for the 8-bit cache dtypes that carry a scale pool."""
    return dtype in QMAX


def raw(t: torch.Tensor) -> torch.Tensor:
    """A uint8 view of an fp8 tensor (CPU index_copy_ / indexing lack fp8 kernels); other
    dtypes are returned as they are. Bits are moved unchanged either way."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


def scales_for(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float16 scales [...] of rows x [..., d]: max|x| / qmax, rounded up to float16."""
    # times the float32 reciprocal, as the C++ write kernel does, so both store the same bits
    target = (x.abs().amax(-1).float() * (1.0 / QMAX[dtype])).clamp_(_SCALE_MIN, _SCALE_MAX)
    s = target.to(SCALE_DTYPE)
    up = s.nextafter(torch.tensor(float("inf"), dtype=SCALE_DTYPE, device=s.device))
    return torch.where(s.float() < target, up, s)


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] -> (values [..., d] of `dtype`, float16 scales [...]), x ~= values * scales."""
    scale = scales_for(x, dtype)
    y = x.float() * scale.float().reciprocal().unsqueeze(-1)
    qmax = QMAX[dtype]
    if dtype == torch.int8:
        return y.round_().clamp_(-qmax, qmax).to(torch.int8), scale
    return y.clamp_(-qmax, qmax).to(dtype), scale


def dequantize(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values [..., d] (int8 / fp8) and scales [...] -> `dtype` [..., d]."""
    return values.to(dtype) * scales.to(dtype).unsqueeze(-1)
