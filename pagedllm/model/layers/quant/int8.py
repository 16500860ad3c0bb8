"""int8 weights with one float32 scale per output channel, quantized at load time.

`--quantization int8` turns an fp32 / bf16 checkpoint's linear layers into
w[n, k] = q[n, k] * scale[n], q = round(w / scale) in [-127, 127], scale = max_k |w[n, k]| / 127
(symmetric, as vLLM's and torchao's int8 weight-only schemes): 4x fewer weight bytes than
fp32, which is what decoding few sequences is bound by.

Two kernels (kernels/quant_int_cpu.cpp), picked by `int8_activations`:
  * weight-only (default): x stays fp32, the kernel converts the int8 weight to fp32 in
    registers (small M) or in an L2-sized scratch (large M); y = scale * (x @ q^T);
  * W8A8 (`--int8-activations`): each row of x is quantized to int8 with its own scale
    (dynamic, per token) and the dot products run in int32 (AVX-512 VNNI `vpdpbusd`, or AVX2
    `maddubs`), as vLLM's CPU backend runs compressed-tensors W8A8; 4x the multiply-adds per
    instruction of fp32 FMA, for big batches. Not exact: the activation rounding changes
    logits slightly (docs/benchmarks.md gives the measured closeness).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.quant.base import QuantizedWeight
from pagedllm.model.layers.quant.int4 import from_panels, panel_width, to_panels


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scale fp32 [N]) with w ~ q * scale[:, None] (symmetric per row)."""
    w = w.float()
    scale = w.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W8A8's per-row activation quantization, as the kernel does it (the tests' reference):
    (q int8 [M, K], scale fp32 [M]), scale = max|x| / 127, q = round-half-even(x / scale)."""
    s = x.abs().amax(dim=1) * (1.0 / 127.0)
    inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))
    return torch.round(x * inv[:, None]).clamp_(-127, 127).to(torch.int8), s


class Int8Weight(QuantizedWeight):
    """int8 per output channel (see the module docstring); `w8a8` selects the W8A8 kernel."""

    format = "int8"

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, w8a8: bool = False) -> None:
        n, k = q.shape
        super().__init__(n, k)
        self.w8a8 = bool(w8a8)
        nb = self.nb = panel_width()
        p = -(-n // nb)
        self.scale = torch.zeros(p * nb)
        self.scale[:n] = scale.float()
        if self.w8a8:
            k4 = -(-k // 4)
            padded = torch.zeros(p * nb, k4 * 4, dtype=torch.int8)
            padded[:n, :k] = q
            # [P, K4, nb, 4]: the four consecutive k of one column side by side
            self.qp = padded.view(p, nb, k4, 4).permute(0, 2, 1, 3).contiguous()
            self.colsum = padded.sum(dim=1, dtype=torch.int32)
        else:
            self.qp = to_panels(q.to(torch.int8), nb)  # [P, K, nb]
            self.colsum = None

    @classmethod
    def from_packed(cls, like: Int8Weight, qp: torch.Tensor, scale: torch.Tensor,
                    colsum: torch.Tensor | None) -> Int8Weight:
        """A weight of `like`'s shape and kernel over already packed tensors (views of a MoE
        layer's stacked experts, model/layers/moe/grouped_quant.py): nothing is repacked."""
        out = cls.__new__(cls)
        QuantizedWeight.__init__(out, like.out_features, like.in_features)
        out.w8a8, out.nb = like.w8a8, like.nb
        out.qp, out.scale, out.colsum = qp, scale, colsum
        return out

    @classmethod
    def quantize(cls, w: torch.Tensor, w8a8: bool = False) -> Int8Weight:
        return cls(*quantize_per_channel(w), w8a8=w8a8)

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q int8 [N, K], scale fp32 [N])."""
        n, k = self.shape
        if self.w8a8:
            p, k4, nb, _ = self.qp.shape
            q = self.qp.permute(0, 2, 1, 3).reshape(p * nb, k4 * 4)[:n, :k]
        else:
            q = from_panels(self.qp, n)
        return q, self.scale[:n]

    def dequantize(self) -> torch.Tensor:
        q, scale = self.unpacked()
        return q.float() * scale[:, None]

    def embedding(self, token_ids: torch.Tensor) -> torch.Tensor:
        q, scale = self.unpacked()
        return q[token_ids].float() * scale[token_ids, None]

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        ops = cpu_ops.fp32_ops(x, "int")
        if ops is None or self.nb != ops.quant_panel_width():
            return self._torch_linear(x)
        if self.w8a8:
            return ops.w8a8_linear(x, self.qp, self.scale, self.colsum, self.out_features, None)
        return ops.int8_linear(x, self.qp, self.scale, self.out_features, None, -1)

    def _torch_linear(self, x: torch.Tensor) -> torch.Tensor:
        """The kernels' arithmetic in torch (used without the C++ kernels)."""
        q, scale = self.unpacked()
        if not self.w8a8:
            return (x @ q.float().t()) * scale
        xq, xs = quantize_activations(x)
        dots = (xq.to(torch.int32) @ q.to(torch.int32).t()).float()
        return dots * xs[:, None] * scale

    @property
    def nbytes(self) -> int:
        held = self.qp.numel() + self.scale.numel() * 4
        return held + (self.colsum.numel() * 4 if self.colsum is not None else 0)

    @classmethod
    def concat(cls, parts: Sequence[Int8Weight]) -> Int8Weight:
        if len({p.w8a8 for p in parts}) != 1:
            raise NotImplementedError("int8 parts with and without W8A8")
        qs, scales = zip(*(p.unpacked() for p in parts), strict=True)
        return cls(torch.cat(qs), torch.cat(scales), w8a8=parts[0].w8a8)
