"""Rotary position embedding, always in float32.

cos/sin are computed in fp32 from each token's absolute position (taken from the request's
`num_computed_tokens`, never batch-relative), applied to q and k in fp32 and cast back. The
table grows on demand up to max_model_len. Rope scaling variants live in `rope_scaling.py`.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.model.layers.rope_scaling import compute_inv_freq


class RotaryEmbedding(nn.Module):
    """HF-layout rotary embedding (rotate-half over the first `rotary_dim` features)."""

    def __init__(self, head_dim: int, rotary_dim: int, max_position: int, base: float,
                 rope_scaling: dict | None = None) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.max_position = max_position
        self.base = base
        self.rope_scaling = rope_scaling
        # Plain tensors, not buffers: the model is built on the meta device and these must be
        # real; they are computed on the CPU and moved to the device of the positions.
        with torch.device("cpu"):
            self.inv_freq, self.attention_scaling = compute_inv_freq(
                rotary_dim, base, rope_scaling, max_position)
        self._cos_sin: torch.Tensor | None = None  # [len, rotary_dim] cos || sin halves

    def _table(self, needed: int, device: torch.device) -> torch.Tensor:
        if self._cos_sin is None or self._cos_sin.shape[0] < needed or (
                self._cos_sin.device != device):
            length = max(needed, 256, 0 if self._cos_sin is None else 2 * self._cos_sin.shape[0])
            t = torch.arange(length, device="cpu", dtype=torch.float32)
            freqs = torch.outer(t, self.inv_freq.float())
            self._cos_sin = torch.cat(
                [freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling],
                -1).to(device)
        return self._cos_sin

    def cos_sin(self, positions: torch.Tensor, max_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 cos and sin of shape [T, 1, rotary_dim] for the given absolute positions."""
        table = self._table(max_pos + 1, positions.device)[positions]
        half = self.rotary_dim // 2
        cos, sin = table[:, :half], table[:, half:]
        cos = torch.cat([cos, cos], -1).unsqueeze(1)
        sin = torch.cat([sin, sin], -1).unsqueeze(1)
        return cos, sin

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate `x` [T, heads, head_dim] in fp32; features past rotary_dim pass through."""
        rot = cos.shape[-1]
        xf = x.float()
        xr = xf[..., :rot]
        x1, x2 = xr.chunk(2, dim=-1)
        rotated = torch.cat([-x2, x1], -1)
        out = xr * cos + rotated * sin
        if rot < x.shape[-1]:
            out = torch.cat([out, xf[..., rot:]], -1)
        return out.to(x.dtype)
