"""Write new tokens' K or V rows into their cache slots (one program per token).

    x [T, kv_heads, d] --slot_mapping [T]--> cache[slot // block_size, slot % block_size]

A negative slot is skipped: the padded rows of a CUDA-graph batch write nowhere. With an
int8 / fp8 cache each (token, head) row is quantized with the scale of kv_quant.quantize
(max|x| / qmax rounded *up* to float16; values x * (1 / scale), rounded to nearest even),
so the Triton and the torch / C++ writers store the same bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedllm.kernels.triton.bits import QMAX, code_of, encode8, raw_view


@triton.jit
def _write_kernel(x_ptr, cache_ptr, slot_ptr, stride_xt, ROW: tl.constexpr,
                  ROW_PAD: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        offs = tl.arange(0, ROW_PAD)
        m = offs < ROW
        x = tl.load(x_ptr + t * stride_xt + offs, mask=m)
        tl.store(cache_ptr + slot * ROW + offs, x.to(cache_ptr.dtype.element_ty), mask=m)


@triton.jit
def _quant_kernel(x_ptr, cache_ptr, scale_ptr, slot_ptr, stride_xt, stride_xh, qmax,
                  KVH: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                  CODE: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        d = tl.arange(0, D_PAD)
        m = d < D
        x = tl.load(x_ptr + t * stride_xt + h * stride_xh + d, mask=m, other=0.0)
        x = x.to(tl.float32)
        target = tl.max(tl.abs(x), axis=0) * (1.0 / qmax)
        target = tl.minimum(tl.maximum(target, 5.9604644775390625e-08), 65504.0)
        s16 = target.to(tl.float16)
        up = (s16.to(tl.int16, bitcast=True) + 1).to(tl.float16, bitcast=True)
        s16 = tl.where(s16.to(tl.float32) < target, up, s16)
        y = x * (1.0 / s16.to(tl.float32))
        y = tl.minimum(tl.maximum(y, -qmax), qmax)
        q = encode8(y, CODE)
        tl.store(cache_ptr + (slot * KVH + h) * D + d, q.to(cache_ptr.dtype.element_ty, bitcast=True),
                 mask=m)
        tl.store(scale_ptr + slot * KVH + h, s16)


def _check(x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> tuple[int, int, int]:
    if x.dim() != 3 or x.stride(-1) != 1 or x.stride(1) != x.shape[2]:
        raise ValueError("x must be [T, kv_heads, d] with contiguous rows")
    t, kvh, d = x.shape
    if cache.shape[-2:] != (kvh, d) or not cache.is_contiguous():
        raise ValueError(f"cache rows {tuple(cache.shape[-2:])} do not match x ({kvh}, {d})")
    if slots.shape != (t,):
        raise ValueError(f"slot_mapping has shape {tuple(slots.shape)}, expected ({t},)")
    return t, kvh, d


def write_into_cache(x: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Store rows x [T, kvh, d] at `slots` of an unquantized cache (negative slot: skip)."""
    t, kvh, d = _check(x, cache, slots)
    if t:
        _write_kernel[(t,)](x, cache, slots, x.stride(0), ROW=kvh * d,
                            ROW_PAD=triton.next_power_of_2(kvh * d))


def quantize_into_cache(x: torch.Tensor, cache: torch.Tensor, scales: torch.Tensor,
                        slots: torch.Tensor) -> None:
    """The C++ `quantize_into_cache`: quantize rows x [T, kvh, d] into an int8 / fp8 cache
    and its float16 scales [.., block_size, kvh] at `slots` (negative slot: skip)."""
    t, kvh, d = _check(x, cache, slots)
    code = code_of(cache.dtype)
    if not code:
        raise ValueError(f"quantize_into_cache: int8 or fp8 cache expected, got {cache.dtype}")
    if t:
        _quant_kernel[(t, kvh)](x, raw_view(cache), scales, slots, x.stride(0), x.stride(1),
                            QMAX[code], KVH=kvh, D=d, D_PAD=triton.next_power_of_2(d),
                            CODE=code)
