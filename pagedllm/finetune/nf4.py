"""NF4 (4-bit NormalFloat) weights with double-quantized scales: QLoRA's frozen base.

Each block of 64 weights keeps its absmax; each weight is the nearest of the 16 NF4 values
(the quantiles of N(0, 1) scaled to [-1, 1], Dettmers et al. 2023, the table bitsandbytes
uses) times that absmax, two 4-bit codes per byte (first in the high nibble, as bnb packs).
Double quantization stores the absmaxes themselves in 8 bits: minus their mean, in blocks
of 256, each block coded in bitsandbytes' 8-bit dynamic map with one fp32 absmax::

    weights  w[0..63] w[64..127] ...          -> codes uint8 [n/2], absmax fp32 [n/64]
    absmax   a[0..255] a[256..511] ...        -> uint8 [n/64], absmax fp32 [n/64/256], mean

Bytes per weight: 0.5 + 1/64 + 4/(64*256) ~= 0.516 (fp32 is 4). `linear` dequantizes on
the fly in forward and again in backward (nothing dense is kept between them).
"""

from __future__ import annotations

import torch

from pagedllm.model.layers.quant.base import QuantizedWeight

NF4_TABLE = torch.tensor([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0])
BLOCK = 64
SCALE_BLOCK = 256
_MIDPOINTS = (NF4_TABLE[1:] + NF4_TABLE[:-1]) / 2


def quantize_nf4(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed codes uint8 [n/2], absmax fp32 [n/block]) of a weight whose size is a
    multiple of `block`."""
    flat = w.detach().float().reshape(-1, block)
    absmax = flat.abs().amax(1)
    normed = flat / torch.where(absmax > 0, absmax, 1.0)[:, None]
    codes = torch.bucketize(normed.reshape(-1), _MIDPOINTS.to(w.device)).to(torch.uint8)
    return (codes[0::2] << 4) | codes[1::2], absmax


def dequantize_nf4(packed: torch.Tensor, absmax: torch.Tensor,
                   block: int = BLOCK) -> torch.Tensor:
    codes = torch.stack([packed >> 4, packed & 0xF], -1).reshape(-1, block).long()
    return NF4_TABLE.to(absmax.device)[codes] * absmax[:, None]


def dynamic_map() -> torch.Tensor:
    """bitsandbytes' signed 8-bit dynamic map (`create_dynamic_map`): 256 sorted values in
    [-1, 1], dense near 0 (a decade per exponent step), that the block scales are coded in."""
    data = []
    for i in range(7):
        bounds = torch.linspace(0.1, 1, 2 ** i + 1)
        means = (bounds[:-1] + bounds[1:]) / 2.0
        data += (10 ** (-6 + i) * means).tolist() + (-(10 ** (-6 + i)) * means).tolist()
    data += [0.0, 1.0]
    data += [0.0] * (256 - len(data))
    return torch.tensor(sorted(data))


DYNAMIC_MAP = dynamic_map()


def quantize_scales(absmax: torch.Tensor, block: int = SCALE_BLOCK
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(uint8 codes [n] into DYNAMIC_MAP, fp32 absmax per block, fp32 mean):
    absmax ~= DYNAMIC_MAP[codes] * block_absmax + mean (bitsandbytes' double quantization)."""
    mean = absmax.mean()
    centered = absmax - mean
    pad = (-centered.numel()) % block
    blocks = torch.nn.functional.pad(centered, (0, pad)).view(-1, block)
    scale = blocks.abs().amax(1)
    normed = (blocks / torch.where(scale > 0, scale, 1.0)[:, None]).reshape(-1)
    code = DYNAMIC_MAP.to(absmax.device)
    hi = torch.bucketize(normed, code).clamp(1, 255)
    lo = hi - 1
    nearest = torch.where((normed - code[lo]).abs() <= (code[hi] - normed).abs(), lo, hi)
    return nearest.to(torch.uint8)[:absmax.numel()], scale, mean


def dequantize_scales(q: torch.Tensor, scale: torch.Tensor, mean: torch.Tensor,
                      block: int = SCALE_BLOCK) -> torch.Tensor:
    values = DYNAMIC_MAP.to(q.device)[q.long()]
    pad = (-q.numel()) % block
    blocks = torch.nn.functional.pad(values, (0, pad)).view(-1, block)
    return (blocks * scale[:, None]).reshape(-1)[:q.numel()] + mean


class _NF4Matmul(torch.autograd.Function):
    """y = x @ W^T with W dequantized in forward and again in backward (grad to x only)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: NF4Weight) -> torch.Tensor:
        ctx.weight = weight
        return x @ weight.dequantize().to(x.dtype).t()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad @ ctx.weight.dequantize().to(grad.dtype), None


class NF4Weight(QuantizedWeight):
    """A frozen linear weight in NF4 with double-quantized block scales."""

    format = "nf4"

    def __init__(self, w: torch.Tensor) -> None:
        out_features, in_features = w.shape
        super().__init__(out_features, in_features)
        if w.numel() % BLOCK:
            raise ValueError(f"NF4 needs weights whose size is a multiple of {BLOCK}; "
                             f"{tuple(w.shape)} is not")
        self.codes, absmax = quantize_nf4(w)
        self.scale_codes, self.scale_scale, self.scale_mean = quantize_scales(absmax)

    def absmax(self) -> torch.Tensor:
        return dequantize_scales(self.scale_codes, self.scale_scale, self.scale_mean)

    def dequantize(self) -> torch.Tensor:
        return dequantize_nf4(self.codes, self.absmax()).view(self.out_features,
                                                               self.in_features)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        return _NF4Matmul.apply(x, self)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (
            self.codes, self.scale_codes, self.scale_scale, self.scale_mean))
