"""Inverse frequencies for RoPE and its scaling variants (HF `rope_scaling` semantics)."""

from __future__ import annotations

import math

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


def compute_inv_freq(dim: int, base: float, rope_scaling: dict | None,
                     max_position: int) -> tuple[torch.Tensor, float]:
    """Return (inv_freq [dim/2] fp32, attention scaling factor applied to cos/sin)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if not rope_scaling:
        return inv_freq, 1.0
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq, 1.0
    if rope_type == "linear":
        return inv_freq / float(rope_scaling["factor"]), 1.0
    if rope_type == "llama3":
        return _llama3(inv_freq, rope_scaling), 1.0
    raise ValueError(f"rope_scaling type {rope_type!r} is not supported; supported: "
                     f"{', '.join(SUPPORTED_ROPE_TYPES)}")


def _llama3(inv_freq: torch.Tensor, cfg: dict) -> torch.Tensor:
    factor = float(cfg["factor"])
    low = float(cfg.get("low_freq_factor", 1.0))
    high = float(cfg.get("high_freq_factor", 4.0))
    old_len = float(cfg["original_max_position_embeddings"])
    low_wavelen = old_len / low
    high_wavelen = old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, smoothed, scaled)
