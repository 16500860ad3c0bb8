"""int8 weights with one float32 scale per output channel, quantized at load time.

`--quantization int8` turns an fp32 / bf16 checkpoint's linear layers into
w[n, k] = q[n, k] * scale[n], q = round(w / scale) in [-127, 127], scale = max_k |w[n, k]| / 127
(symmetric, as vLLM's and torchao's int8 weight-only schemes): 4x fewer weight bytes than
fp32, which is what decoding few sequences is bound by.

Two kernels (the "int" family, kernels/quant_int_cpu.cpp), picked by `int8_activations`:
  * weight-only (default): x stays fp32, the kernel converts the int8 weight to fp32 in
    registers (small M) or in an L2-sized scratch (large M); y = scale * (x @ q^T);
  * W8A8 (`--int8-activations`, kernels/quant_w8a8_cpu.cpp): x is quantized to int8 with a
    scale per 32 values of a row (dynamic, symmetric, llama.cpp's q8 activations, as the GGUF
    int8-activation path) and the dot products run in int32 (AVX-512 VNNI `vpdpbusd`, or
    AVX2 `maddubs`), each block's sum scaled and added in fp32; 4x the multiply-adds per
    instruction of fp32 FMA, for big batches. Not exact: the activation rounding changes
    logits slightly (a scale per token cost +3.8% perplexity on SmolLM2, one per 32 values
    costs +0.37%, int8 weights alone +0.20%: docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.quant.base import QuantizedWeight
from pagedllm.model.layers.quant.int4 import extern_ref, from_panels, panel_width, to_panels


def quantize_per_channel(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scale fp32 [N]) with w ~ q * scale[:, None] (symmetric per row)."""
    w = w.float()
    scale = w.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


ACT_BLOCK = 32  # activation values per W8A8 scale


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W8A8's activation quantization, as the kernel does it (the tests' reference): each row
    of x [M, K] padded with zeros to whole blocks of 32 values, block b of row m scaled by
    d[m, b] = max|x| / 127 (as x * (1/127)), q = round-half-even(x / d) in [-127, 127].
    Returns (q int8 [M, K32], d fp32 [M, K32 / 32])."""
    m, k = x.shape
    k32 = -(-k // ACT_BLOCK) * ACT_BLOCK
    xb = torch.nn.functional.pad(x.float(), (0, k32 - k)).view(m, k32 // ACT_BLOCK, ACT_BLOCK)
    d = xb.abs().amax(dim=2) * (1.0 / 127.0)
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(xb * inv[..., None]).clamp_(-127, 127).to(torch.int8)
    return q.view(m, k32), d


def w8a8_code_offset() -> int:
    """What the W8A8 kernel wants added to each packed int8 code: 128 where AVX-512 VNNI's
    vpdpbusd takes the weight as u8, 0 where the codes stay s8 (or without the kernels)."""
    ops = cpu_ops.load_int()
    return int(ops.w8a8_code_offset()) if ops is not None else 0


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
        self.code_offset = 0
        if self.w8a8:
            # [P, K32 / 4, nb, 4] uint8: k padded to whole activation blocks, the four
            # consecutive k of one column side by side, each code + code_offset (as bytes)
            self.code_offset = w8a8_code_offset()
            k32 = -(-k // ACT_BLOCK) * ACT_BLOCK
            padded = torch.zeros(p * nb, k32, dtype=torch.int16)
            padded[:n, :k] = q
            codes = (padded + self.code_offset).to(torch.uint8)
            self.qp = codes.view(p, nb, k32 // 4, 4).permute(0, 2, 1, 3).contiguous()
        else:
            self.qp = to_panels(q.to(torch.int8), nb)  # [P, K, nb]

    @classmethod
    def from_packed(cls, like: Int8Weight, qp: torch.Tensor, scale: torch.Tensor) -> Int8Weight:
        """A weight of `like`'s shape and kernel over already packed tensors (views of a MoE
        layer's stacked experts, model/layers/moe/grouped_quant.py): nothing is repacked."""
        out = cls.__new__(cls)
        QuantizedWeight.__init__(out, like.out_features, like.in_features)
        out.w8a8, out.nb, out.code_offset = like.w8a8, like.nb, like.code_offset
        out.qp, out.scale = qp, scale
        return out

    @classmethod
    def quantize(cls, w: torch.Tensor, w8a8: bool = False) -> Int8Weight:
        return cls(*quantize_per_channel(w), w8a8=w8a8)

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(q int8 [N, K], scale fp32 [N])."""
        n, k = self.shape
        if self.w8a8:
            p, k4, nb, _ = self.qp.shape
            codes = self.qp.permute(0, 2, 1, 3).reshape(p * nb, k4 * 4)[:n, :k]
            q = (codes.to(torch.int16) - self.code_offset).to(torch.int8)
        else:
            q = from_panels(self.qp, n)
        return q, self.scale[:n]

    def dequantize(self) -> torch.Tensor:
        q, scale = self.unpacked()
        return q.float() * scale[:, None]

    def embedding(self, token_ids: torch.Tensor) -> torch.Tensor:
        q, scale = self.unpacked()
        return q[token_ids].float() * scale[token_ids, None]

    def _kernels_take(self, int_ops) -> bool:
        """Whether the int module's kernel takes these panels: built, the same width and, for
        W8A8, the same code offset (packed for this build's kernel; else torch computes)."""
        return (int_ops is not None and self.nb == int_ops.quant_panel_width()
                and (not self.w8a8 or self.code_offset == int_ops.w8a8_code_offset()))

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        ops = cpu_ops.fp32_ops(x, "int")
        if not self._kernels_take(ops):
            return self._torch_linear(x)
        if self.w8a8:
            return ops.w8a8_linear(x, self.qp, self.scale, self.out_features, None)
        return ops.int8_linear(x, self.qp, self.scale, self.out_features, None, -1)

    def fused_ref(self, ops, bias: torch.Tensor | None):
        int_ops = cpu_ops.load_int()
        if not self._kernels_take(int_ops):
            return None
        return extern_ref(ops, int_ops, "w8a8" if self.w8a8 else "int8", self,
                          [self.qp, self.scale], 0, bias)

    def _torch_linear(self, x: torch.Tensor) -> torch.Tensor:
        """The kernels' arithmetic in torch (used without the C++ kernels)."""
        q, scale = self.unpacked()
        if not self.w8a8:
            return (x @ q.float().t()) * scale
        # exact integer block sums (float64 holds them), each added in k order as the
        # kernel's fp32 FMA does (one rounding: the float64 product of two floats is exact)
        xq, xd = quantize_activations(x)
        w = torch.nn.functional.pad(q.double(), (0, xq.shape[1] - q.shape[1]))
        y = torch.zeros(x.shape[0], q.shape[0])
        for b in range(xd.shape[1]):
            cols = slice(b * ACT_BLOCK, (b + 1) * ACT_BLOCK)
            dots = xq[:, cols].double() @ w[:, cols].t()
            y = (y.double() + dots * xd[:, b:b + 1].double()).float()
        return y * scale

    @property
    def nbytes(self) -> int:
        return self.qp.numel() + self.scale.numel() * 4

    @classmethod
    def concat(cls, parts: Sequence[Int8Weight]) -> Int8Weight:
        if len({p.w8a8 for p in parts}) != 1:
            raise NotImplementedError("int8 parts with and without W8A8")
        qs, scales = zip(*(p.unpacked() for p in parts), strict=True)
        return cls(torch.cat(qs), torch.cat(scales), w8a8=parts[0].w8a8)
