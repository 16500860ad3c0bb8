"""4-bit weights with a scale and a zero point per group of input channels (AWQ and GPTQ).

Both formats say w[n, k] = (q[n, k] - z[n, g]) * s[n, g] with q, z in 0..15, s float16 and
g = k // group_size (after GPTQ's act-order permutation of k, see `perm`). They differ only in
how the checkpoint packs q and z into int32 words (awq.py, gptq.py unpack them); here both are
repacked once into the layout of `int4_linear` (kernels/quant_int_cpu.cpp): panels of NB output
columns, two columns per byte, the panel's zeros (uint8) and scales (float16) per group.

GPTQ with `desc_act` quantizes the input channels in a permuted order, so its groups are not
contiguous in k: `perm` lists the input channels in group order (sorted g_idx), the packed
weight is stored in that order and `linear` gathers x's columns the same way (as vLLM does).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.quant.base import QuantizedWeight

_FALLBACK_NB = 32  # panel width when the C++ kernels are unavailable (torch fallback)


def panel_width() -> int:
    """Output columns per packed panel of the integer kernels (32 with AVX-512, 16 AVX2)."""
    ops = cpu_ops.load_int()
    return int(ops.quant_panel_width()) if ops is not None else _FALLBACK_NB


def to_panels(t: torch.Tensor, nb: int) -> torch.Tensor:
    """[N, X] -> [P, X, nb]: rows grouped in panels of nb (N padded with zeros), transposed."""
    n, x = t.shape
    p = -(-n // nb)
    padded = t.new_zeros(p * nb, x)
    padded[:n] = t
    return padded.view(p, nb, x).transpose(1, 2).contiguous()


def from_panels(t: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of `to_panels`: [P, X, nb] -> [n, X]."""
    p, x, nb = t.shape
    return t.transpose(1, 2).reshape(p * nb, x)[:n].contiguous()


EXTERN_KIND = 5  # kernels/decode_layers_cpu.cpp: a kernel of the "int" module, by address


def extern_ref(ops, int_ops, kernel: str, weight: QuantizedWeight,
               tensors: Sequence[torch.Tensor], arg: int, bias: torch.Tensor | None):
    """`weight` in the core module's C++ decode loop (`ops.LinearRef`) through the "int"
    module `int_ops`'s kernel `kernel` ("int8", "w8a8", "int4"; kernels/extern_linear_cpu.h),
    which the caller has checked takes `weight`: the same call as `linear` makes, without
    Python between the layers."""
    return ops.LinearRef(EXTERN_KIND, 0, weight.out_features, weight.in_features, arg,
                         list(tensors), bias, int_ops.extern_linear(kernel))


class Int4GroupWeight(QuantizedWeight):
    """int4 with per-group float16 scales and uint8 zero points (see the module docstring)."""

    format = "int4"

    def __init__(self, q: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor,
                 group_size: int, perm: torch.Tensor | None = None) -> None:
        """q: [N, K] integers 0..15 (k in group order), zeros: [N, G] 0..15, scales: [N, G]
        float, group_size * G == K; perm: [K] input channel of each k (None: identity)."""
        n, k = q.shape
        super().__init__(n, k)
        g = zeros.shape[1]
        if group_size * g != k or zeros.shape != scales.shape or zeros.shape[0] != n:
            raise ValueError(f"int4 weight [{n}, {k}]: zeros {tuple(zeros.shape)} / scales "
                             f"{tuple(scales.shape)} do not give groups of {group_size}")
        if perm is not None and perm.equal(torch.arange(k)):
            perm = None
        self.group_size = int(group_size)
        self.perm = perm.long().contiguous() if perm is not None else None
        nb = self.nb = panel_width()
        q8 = to_panels(q.to(torch.uint8), nb)  # [P, K, nb]
        self.qp = (q8[..., : nb // 2] | (q8[..., nb // 2:] << 4)).contiguous()
        self.zp = to_panels(zeros.to(torch.uint8), nb)   # [P, G, nb]
        self.sp = to_panels(scales.to(torch.float16), nb)

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q [N, K], zeros [N, G], scales [N, G]) in group order (k permuted by `perm`)."""
        q8 = torch.cat([self.qp & 15, self.qp >> 4], dim=-1)
        n = self.out_features
        return from_panels(q8, n), from_panels(self.zp, n), from_panels(self.sp, n)

    def dequantize(self) -> torch.Tensor:
        q, z, s = self.unpacked()
        zk = z.repeat_interleave(self.group_size, dim=1).to(torch.int32)
        w = (q.to(torch.int32) - zk).float() * s.float().repeat_interleave(self.group_size, 1)
        if self.perm is None:
            return w
        out = torch.empty_like(w)
        out[:, self.perm] = w
        return out

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        if self.perm is not None:
            x = x.index_select(1, self.perm)
        ops = cpu_ops.fp32_ops(x, "int")
        if not self._kernels_take(ops):
            w = self.dequantize() if self.perm is None else self.dequantize()[:, self.perm]
            return x @ w.t()
        return ops.int4_linear(x, self.qp, self.zp, self.sp, self.out_features,
                               self.group_size, None, -1)

    def _kernels_take(self, int_ops) -> bool:
        """Whether the int module's int4 kernel takes these panels (built, the same width)."""
        return int_ops is not None and self.nb == int_ops.quant_panel_width()

    def fused_ref(self, ops, bias: torch.Tensor | None):
        int_ops = cpu_ops.load_int()
        # GPTQ's act-order permutes x first, which the loop does not do
        if self.perm is not None or not self._kernels_take(int_ops):
            return None
        return extern_ref(ops, int_ops, "int4", self, [self.qp, self.zp, self.sp],
                          self.group_size, bias)

    @property
    def nbytes(self) -> int:
        held = sum(t.numel() * t.element_size() for t in (self.qp, self.zp, self.sp))
        return held + (self.perm.numel() * 8 if self.perm is not None else 0)

    @classmethod
    def concat(cls, parts: Sequence[Int4GroupWeight]) -> Int4GroupWeight:
        if len({p.group_size for p in parts}) != 1:
            raise NotImplementedError("int4 parts with different group sizes")
        perms = [p.perm for p in parts]
        if any(p is None for p in perms) != all(p is None for p in perms) or (
                perms[0] is not None and not all(perms[0].equal(p) for p in perms)):
            raise NotImplementedError("int4 parts with different act-order permutations")
        q, z, s = (torch.cat(ts) for ts in zip(*(p.unpacked() for p in parts), strict=True))
        return cls(q, z, s, parts[0].group_size, perms[0])
