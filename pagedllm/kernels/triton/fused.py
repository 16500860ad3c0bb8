"""Fused element-wise ops of the forward pass (kernels/fused_cpu.cpp's contracts, any float
dtype, arithmetic in fp32, rounded where HF rounds):

    add_rms_norm_(x, residual, w, eps)   residual = x + residual (rounded to the dtype);
                                         x = rmsnorm(residual) * w             (in place)
    rms_norm(x, w, eps)                  rmsnorm(x) * w                        (new tensor)
    rotary_qk_(qkv, halves, H, KVH, d)   NeoX RoPE on the q and k heads of qkv (in place)

Llama's norm rounds the normed row to the dtype before multiplying by w (HF
LlamaRMSNorm); Gemma's (`gemma=True`) computes normed * (1 + w) in fp32 (Gemma3RMSNorm).
One program per row: a decode step's norms and RoPE are one launch each instead of 4-8
torch ops, which matters most where the step is launch-bound (small batches, eager mode).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedllm.kernels.triton.bits import cast


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, n, eps, stride_x, stride_r, stride_o,
                     N_PAD: tl.constexpr, ADD: tl.constexpr, GEMMA: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, N_PAD)
    m = offs < n
    x = tl.load(x_ptr + row * stride_x + offs, mask=m, other=0.0)
    if ADD:
        s = cast(x.to(tl.float32) + tl.load(r_ptr + row * stride_r + offs, mask=m,
                                            other=0.0).to(tl.float32), x.dtype)
        tl.store(r_ptr + row * stride_r + offs, s, mask=m)
        x = s
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, 0) / n + eps)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    if GEMMA:
        y = xf * inv * (1.0 + w)
    else:
        y = w * cast(xf * inv, x.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, cast(y, out_ptr.dtype.element_ty), mask=m)


def _rows(x: torch.Tensor, weight: torch.Tensor) -> tuple[int, int]:
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError("x must be [T, hidden] with contiguous rows")
    if weight.numel() != x.shape[1]:
        raise ValueError(f"weight has {weight.numel()} values, x rows {x.shape[1]}")
    return x.shape


def add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                  eps: float, gemma: bool = False) -> None:
    t, n = _rows(x, weight)
    if residual.shape != x.shape or residual.stride(-1) != 1:
        raise ValueError("residual must match x")
    if t:
        _rms_norm_kernel[(t,)](x, residual, weight, x, n, float(eps), x.stride(0),
                               residual.stride(0), x.stride(0),
                               N_PAD=triton.next_power_of_2(n), ADD=True, GEMMA=gemma)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             gemma: bool = False) -> torch.Tensor:
    t, n = _rows(x, weight)
    out = torch.empty_like(x)
    if t:
        _rms_norm_kernel[(t,)](x, x, weight, out, n, float(eps), x.stride(0), x.stride(0),
                               out.stride(0), N_PAD=triton.next_power_of_2(n), ADD=False,
                               GEMMA=gemma)
    return out


@triton.jit
def _rotary_kernel(qkv_ptr, halves_ptr, stride_t, stride_h, HEADS: tl.constexpr,
                   HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, HEADS_PAD)[:, None]
    i = tl.arange(0, HALF_PAD)[None, :]
    m = (h < HEADS) & (i < HALF)
    c = tl.load(halves_ptr + t * 2 * HALF + i, mask=i < HALF, other=0.0)
    s = tl.load(halves_ptr + t * 2 * HALF + HALF + i, mask=i < HALF, other=0.0)
    p1 = qkv_ptr + t * stride_t + h * stride_h + i
    x1 = tl.load(p1, mask=m, other=0.0)
    x2 = tl.load(p1 + HALF, mask=m, other=0.0)
    a, b = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(p1, cast(a * c - b * s, x1.dtype), mask=m)
    tl.store(p1 + HALF, cast(b * c + a * s, x1.dtype), mask=m)


def rotary_qk_(qkv: torch.Tensor, halves: torch.Tensor, num_heads: int, num_kv_heads: int,
               head_dim: int) -> None:
    """qkv [T, (H + 2 KVH) * d]; halves [T, rot] fp32 = cos | sin of the rot / 2
    frequencies; rotates the first rot features of the H + KVH q and k heads."""
    t = qkv.shape[0]
    if qkv.dim() != 2 or qkv.stride(-1) != 1 or qkv.shape[1] != (
            num_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError("qkv must be [T, (H + 2 KVH) * d] with contiguous rows")
    if halves.shape[0] != t or not halves.is_contiguous() or halves.dtype != torch.float32:
        raise ValueError("halves must be contiguous fp32 [T, rot]")
    heads, half = num_heads + num_kv_heads, halves.shape[1] // 2
    if t:
        _rotary_kernel[(t,)](qkv, halves, qkv.stride(0), head_dim, HEADS=heads,
                             HEADS_PAD=triton.next_power_of_2(heads), HALF=half,
                             HALF_PAD=triton.next_power_of_2(half))
