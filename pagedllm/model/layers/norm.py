"""RMSNorm computed in fp32 (as HF Llama does), optionally fused with the residual add."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (normed(x + residual), x + residual)."""
        if residual is not None:
            x = x + residual
        xf = x.float()
        var = xf.pow(2).mean(-1, keepdim=True)
        normed = (xf * torch.rsqrt(var + self.eps)).to(x.dtype)
        return self.weight * normed, x
