"""RMSNorm computed in fp32 (as HF Llama does), optionally fused with the residual add.

On CPU in fp32 one C++ call (pagedllm/kernels/fused_cpu.cpp) does the add and the norm, in
place: `x` (a fresh layer output) receives the normed values and `residual` the sum.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.kernels import cpu_ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (normed(x + residual), x + residual); may overwrite x and residual."""
        ops = cpu_ops.fp32_ops(x)
        if ops is not None and x.dim() == 2 and x.is_contiguous():
            if residual is None:
                return ops.rms_norm(x, self.weight, self.eps), x
            ops.add_rms_norm_(x, residual, self.weight, self.eps)
            return x, residual
        if residual is not None:
            x = x + residual
        xf = x.float()
        var = xf.pow(2).mean(-1, keepdim=True)
        normed = (xf * torch.rsqrt(var + self.eps)).to(x.dtype)
        return self.weight * normed, x
