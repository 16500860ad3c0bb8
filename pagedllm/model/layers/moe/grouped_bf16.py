"""bf16 experts of one projection, packed once for the grouped bf16 kernel
(kernels/grouped_bf16_cpu.cpp), which runs every expert's fp32 rows in one call:

    weights bf16 [E, N, K]  --pack-->  [E, P, K2, 32, 2]    P = ceil(N / 32), K2 = ceil(K / 2)
                                       panel p, pair k2: 32 columns x (w[.., 2k2], w[.., 2k2+1])

    run(xs fp32 [R, K], offsets) -> fp32 [R, N]
        a group of fewer than MIN_BF16_ROWS (5) rows: fp32 x times the weights widened exactly
        to fp32, fp32 FMA chains (equal to the fp32 linear over `dense(e).float()`)
        MIN_BF16_ROWS rows or more, where the CPU has avx512_bf16: x rounded to bf16, the bf16
        dot product with fp32 accumulation (on other CPUs these groups stay exact: there the
        rounding would buy no speed)

The kernel picks this CPU's best instruction set; PAGEDLLM_BF16_ISA names another one it
runs (`isas()`: avx512_bf16, avx512, avx2, generic) to test or compare each path.
"""

from __future__ import annotations

import functools
import os

import torch

from pagedllm.errors import InvalidInputError
from pagedllm.kernels import cpu_ops
from pagedllm.kernels import triton as triton_kernels
from pagedllm.model.layers.moe.grouped import GroupedLinear
from pagedllm.model.layers.quant.bf16 import BF16_KIND

#: rows of one expert's group from which the kernel rounds x to bf16 for the bf16 dot product.
#: Measured (benchmarks/moe.py --only layer, "rows/expert"; 8 experts, H 1024 / 2048, one
#: thread, CPU time, Zen 4/5 under load 5-8): up to 4 rows the exact path runs two panels
#: per pass and reads weights near memory speed, the dot product only 1.1-1.4x faster; from
#: 5 rows the exact path is bound by its FMAs (two per pair of k) and the dot product is
#: 2.0-2.6x faster. So groups of up to 4 rows (decode: a token's experts) stay exact.
MIN_BF16_ROWS = 5
ISA_ENV = "PAGEDLLM_BF16_ISA"


class UnknownISAError(InvalidInputError):
    """PAGEDLLM_BF16_ISA names an instruction set the bf16 kernel cannot run on this CPU."""


@functools.cache
def isas() -> tuple[str, ...]:
    """The instruction sets the bf16 grouped kernel runs on this CPU, best first (() without
    the C++ kernels)."""
    ops = cpu_ops.load()
    return tuple(ops.bf16_isas()) if ops is not None and hasattr(ops, "bf16_isas") else ()


def forced_isa() -> str:
    """The ISA PAGEDLLM_BF16_ISA asks for ("" when unset: the kernel takes the best)."""
    want = os.environ.get(ISA_ENV, "")
    if want and want not in isas():
        raise UnknownISAError(f"{ISA_ENV}={want!r}: the bf16 kernel runs one of "
                              f"{', '.join(isas())} on this CPU")
    return want


class Bf16Experts(GroupedLinear):
    """bf16 experts [E, N, K] in the grouped bf16 kernel's panels (module doc)."""

    def __init__(self, ops, weights: torch.Tensor, min_bf16_rows: int = MIN_BF16_ROWS) -> None:
        e, n, k = weights.shape
        super().__init__(e, n, k)
        if min_bf16_rows < 1:
            raise ValueError(f"min_bf16_rows must be at least 1, got {min_bf16_rows}")
        self.ops, self.min_bf16_rows = ops, min_bf16_rows
        width = ops.bf16_panel_width()
        panels, pairs = -(-n // width), -(-k // 2)
        padded = weights  # zero-padded to whole panels and pairs only where it is not
        if (panels * width, 2 * pairs) != (n, k):
            padded = weights.new_zeros(e, panels * width, 2 * pairs)
            padded[:, :n, :k] = weights
        self.packed = padded.view(e, panels, width, pairs, 2).permute(0, 1, 3, 2, 4).contiguous()

    def run(self, xs: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.ops.bf16_grouped_linear(xs, self.packed, self.out_features, offsets,
                                            self.min_bf16_rows, forced_isa())

    def fused_ref(self, ops):
        """The C++ MoE block's form (its own ISA choice, so None while PAGEDLLM_BF16_ISA
        forces one: the Python path honours it)."""
        if forced_isa():
            return None
        return ops.ExpertsRef(BF16_KIND, 0, self.out_features, self.in_features,
                              self.min_bf16_rows, [self.packed])

    def dense(self, expert: int) -> torch.Tensor:
        """Expert `expert`'s HF-layout bf16 weight [N, K] back from its panels."""
        panels, pairs, width = self.packed.shape[1:4]
        full = self.packed[expert].permute(0, 2, 1, 3).reshape(panels * width, 2 * pairs)
        return full[: self.out_features, : self.in_features]

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()


def bf16_experts(weights: torch.Tensor) -> Bf16Experts | None:
    """bf16 stacked experts [E, N, K] packed for the grouped bf16 kernel, or None where it
    does not apply (another device or dtype, kernels not built, the Triton fused-MoE kernel
    runs them: see grouped.packed_experts)."""
    if weights.device.type != "cpu" or weights.dtype != torch.bfloat16 or not weights.numel():
        return None
    if triton_kernels.enabled_for(weights.device):
        return None
    ops = cpu_ops.load()
    if ops is None or not hasattr(ops, "bf16_grouped_linear"):
        return None
    return Bf16Experts(ops, weights.detach())
