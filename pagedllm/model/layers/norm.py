"""RMSNorm computed in fp32 (as HF Llama does), optionally fused with the residual add.

On CPU in fp32 one C++ call (pagedllm/kernels/fused_cpu.cpp, Gemma's `1 + weight` too) does
the add and the norm, in place: `x` (a fresh layer output) receives the normed values and
`residual` the sum; on CUDA one Triton kernel (kernels/triton/fused.py) does the same in any
dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.kernels import cpu_ops
from pagedllm.kernels import triton as triton_ops


def _triton_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 eps: float, gemma: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fused Triton norm (CUDA) for 2-D rows, else None."""
    if x.dim() != 2 or x.stride(-1) != 1 or not triton_ops.enabled(x):
        return None
    from pagedllm.kernels.triton import fused

    if residual is None:
        return fused.rms_norm(x, weight, eps, gemma=gemma), x
    fused.add_rms_norm_(x, residual, weight, eps, gemma=gemma)
    return x, residual


def _cpu_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
              eps: float, gemma: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fused C++ norm (fp32 CPU rows; `gemma`: times 1 + weight) for contiguous 2-D
    rows, else None. Gemma 3's ~8 torch ops a norm, six norms a layer, were ~12% of its
    one-stream decode step."""
    ops = cpu_ops.fp32_ops(x)
    if ops is None or x.dim() != 2 or not x.is_contiguous() or weight.dtype != torch.float32:
        return None
    if residual is None:
        return ops.rms_norm(x, weight, eps, gemma), x
    ops.add_rms_norm_(x, residual, weight, eps, gemma)
    return x, residual


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (normed(x + residual), x + residual); may overwrite x and residual."""
        if (fused := _triton_norm(x, residual, self.weight, self.eps, False)) is not None:
            return fused
        if (fused := _cpu_norm(x, residual, self.weight, self.eps, False)) is not None:
            return fused
        if residual is not None:
            x = x + residual
        xf = x.float()
        var = xf.pow(2).mean(-1, keepdim=True)
        normed = (xf * torch.rsqrt(var + self.eps)).to(x.dtype)
        return self.weight * normed, x


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: `normed(x) * (1 + weight)` in fp32 (HF stores the offset weight).

    Same contract as :class:`RMSNorm`: returns (normed(x + residual), x + residual).
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if (fused := _triton_norm(x, residual, self.weight, self.eps, True)) is not None:
            return fused
        if (fused := _cpu_norm(x, residual, self.weight, self.eps, True)) is not None:
            return fused
        if residual is not None:
            x = x + residual
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype), x


def head_norms_(qkv: torch.Tensor, q_norm: nn.Module, k_norm: nn.Module, num_heads: int,
                num_kv_heads: int, head_dim: int) -> None:
    """Normalize, in place, each q head and each k head of fused qkv rows
    [T, (H + 2 KVH) * d] over head_dim (Qwen3 / Gemma 3 q/k norm, applied before RoPE): on
    fp32 CPU rows one C++ call (the bits of the norm modules' C++ path, as the C++ decode
    loop does), else each norm module over the heads' rows."""
    kind = type(q_norm)
    if (kind in (RMSNorm, GemmaRMSNorm) and type(k_norm) is kind and q_norm.eps == k_norm.eps
            and qkv.dim() == 2 and qkv.is_contiguous()
            and q_norm.weight.dtype == k_norm.weight.dtype == torch.float32
            and (ops := cpu_ops.fp32_ops(qkv)) is not None):
        ops.head_rms_norms_(qkv, q_norm.weight, k_norm.weight, num_heads, num_kv_heads, head_dim,
                            q_norm.eps, kind is GemmaRMSNorm)
        return
    heads = qkv.view(qkv.shape[0], -1, head_dim)
    q = heads[:, :num_heads]
    k = heads[:, num_heads:num_heads + num_kv_heads]
    q.copy_(q_norm(q.reshape(-1, head_dim).contiguous())[0].view_as(q))
    k.copy_(k_norm(k.reshape(-1, head_dim).contiguous())[0].view_as(k))
