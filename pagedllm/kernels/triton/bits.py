"""8-bit value codecs done with integer bit operations, the same on every GPU and in
Triton's interpreter (whose fp8 casts truncate instead of rounding to nearest).

    code   format          decode (to float16 bits)                      x stored
    1      int8            -                                             q * scale
    2      fp8 e4m3fn      ((b & 0x7F) << 7) | ((b & 0x80) << 8)  = x/256    see kv_quant.py
    3      fp8 e5m2        b << 8                                 = x
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

INT8, E4M3, E5M2 = 1, 2, 3
CODES = {torch.int8: INT8, torch.float8_e4m3fn: E4M3, torch.float8_e5m2: E5M2}
QMAX = {INT8: 127.0, E4M3: 448.0, E5M2: 57344.0}


def code_of(dtype: torch.dtype) -> int:
    """0 for an unquantized cache, else the 8-bit codec's code."""
    return CODES.get(dtype, 0)


def raw_view(t: torch.Tensor) -> torch.Tensor:
    """The bytes of an fp8 cache as uint8 (the kernels decode them themselves)."""
    return t.view(torch.uint8) if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else t


@triton.jit
def decode8(raw, CODE: tl.constexpr):
    """Stored 8-bit values -> float32 (int8 exactly; fp8 through float16 bits)."""
    if CODE == 1:
        return raw.to(tl.float32)
    b = raw.to(tl.uint8, bitcast=True).to(tl.uint16)
    if CODE == 2:
        h = ((b & 0x7F) << 7) | ((b & 0x80) << 8)
        return h.to(tl.float16, bitcast=True).to(tl.float32) * 256.0
    return (b << 8).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _rne_shift(m, s):
    """m >> s rounded to nearest, ties to even (m >= 0, 1 <= s <= 31)."""
    half = (1 << (s - 1)) - 1
    return (m + half + ((m >> s) & 1)) >> s


@triton.jit
def encode8(y, CODE: tl.constexpr):
    """float32 y (already clamped to the format's range) -> the stored byte as uint8: int8
    rounded half to even, or the fp8 byte rounded to nearest even (normals and subnormals).
    One return type for every code: compiled Triton (3.6) rejects a function whose
    constexpr branches return int8 and uint8; the caller bitcasts to the cache's type."""
    if CODE == 1:
        r = tl.floor(y + 0.5)
        tie_odd = ((r - y) == 0.5) & ((r.to(tl.int32) & 1) != 0)
        return tl.where(tie_odd, r - 1.0, r).to(tl.int8).to(tl.uint8, bitcast=True)
    if CODE == 2:
        MANT: tl.constexpr = 3
        BIAS: tl.constexpr = 7
    else:
        MANT: tl.constexpr = 2
        BIAS: tl.constexpr = 15
    u = y.to(tl.int32, bitcast=True)
    sign = (u >> 24) & 0x80
    a = u & 0x7FFFFFFF
    e = (a >> 23) - 127                                   # unbiased exponent of |y|
    # normal in the target: drop 23 - MANT mantissa bits, rebias the exponent
    normal = _rne_shift(a, 23 - MANT) - ((127 - BIAS) << MANT)
    # subnormal in the target: k * 2^(1 - BIAS - MANT), k = |y| / that, rounded
    m24 = (a & 0x7FFFFF) | 0x800000
    s = 24 - e - BIAS - MANT
    s_ok = tl.minimum(tl.maximum(s, 1), 31)
    sub = tl.where(s > 31, 0, _rne_shift(m24, s_ok))
    mag = tl.where(e >= 1 - BIAS, normal, sub)
    mag = tl.where(a == 0, 0, mag)
    return (mag | sign).to(tl.uint8)


@triton.jit
def cast(x, DT: tl.constexpr):
    """x -> DT, rounding to nearest even also for bf16 (done on the bits: the interpreter's
    fp32 -> bf16 cast truncates; on a GPU the result is the same as a plain cast)."""
    if tl.bfloat16 == DT:
        u = x.to(tl.float32).to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.to(tl.float32, bitcast=True).to(DT)
    return x.to(DT)
