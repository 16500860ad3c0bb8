"""One expert projection of a MoE layer (gate|up, or down) for all E experts, stacked so one
C++ call runs every expert's rows (pagedllm/kernels/grouped_cpu.h draws the work items):

    xs [R, K]   rows sorted by expert; expert e owns rows offsets[e] : offsets[e + 1]
    run(xs, offsets) -> [R, N]   rows of e times W_e^T, the same dot products as W_e's
                                 dense (or quantized) linear: equal to a per-expert loop

`grouped_linear(weights)` stacks one projection's per-expert weights into the grouped form of
their format, or returns None when there is none (mixed formats, no kernels, another device):
the layer then runs its per-expert reference loop (experts.py). Stacking keeps one copy:
quantized experts' per-expert weights become views of the stacked tensors.
"""

from __future__ import annotations

import abc
import functools
import itertools
from collections.abc import Callable, Sequence

import torch

from pagedllm.kernels import cpu_ops
from pagedllm.kernels import triton as triton_kernels
from pagedllm.model.layers.quant.base import relocate_fields
from pagedllm.model.layers.quant.dense import PACKED_KIND


class GroupedLinear(abc.ABC):
    """E same-shaped weights [N, K] of one projection, run over rows grouped by expert."""

    def __init__(self, num_experts: int, out_features: int, in_features: int) -> None:
        self.num_experts = num_experts
        self.out_features = out_features
        self.in_features = in_features

    @abc.abstractmethod
    def run(self, xs: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """[R, N] fp32 for contiguous fp32 rows xs [R, K] sorted by expert (offsets [E + 1],
        CPU int64)."""

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes of all E experts' weights."""

    def fused_ref(self, ops):
        """The stack as the C++ decode loop's MoE block takes it (`ops.ExpertsRef`,
        kernels/moe_decode_cpu.h), or None for a format it does not run."""
        return None

    def relocate(self, place: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Every tensor of the stack replaced by `place(tensor)` (worker/weight_arena.py)."""
        relocate_fields(self, place)


class PackedExperts(GroupedLinear):
    """fp32 experts in `packed_linear`'s panels, stacked: [E, P, K, NB] (gemm_cpu.cpp)."""

    def __init__(self, ops, weights: torch.Tensor) -> None:
        e, n, k = weights.shape
        super().__init__(e, n, k)
        self.packed = torch.stack([ops.pack_linear_weight(w.contiguous()) for w in weights])

    def run(self, xs: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return cpu_ops.load().grouped_packed_linear(xs, self.packed, self.out_features, offsets)

    def fused_ref(self, ops):
        return ops.ExpertsRef(PACKED_KIND, 0, self.out_features, self.in_features, 0,
                              [self.packed])

    def dense(self, expert: int) -> torch.Tensor:
        """Expert `expert`'s HF-layout weight [N, K] back from its panels."""
        p, k, nb = self.packed.shape[1:]
        return self.packed[expert].transpose(1, 2).reshape(p * nb, k)[: self.out_features]

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()


def packed_experts(weights: torch.Tensor) -> PackedExperts | None:
    """fp32 stacked experts [E, N, K] in the grouped kernel's panels, or None where the dense
    path would not pack them either (another device or dtype, kernels not built) or where the
    Triton fused-MoE kernel runs them (moe/dispatch.py: it reads the dense stacks; on CPU
    when the interpreter is forced)."""
    if weights.device.type != "cpu" or weights.dtype != torch.float32 or not weights.numel():
        return None
    if triton_kernels.enabled_for(weights.device):
        return None
    ops = cpu_ops.fp32_ops(weights.detach())
    if ops is None or not hasattr(ops, "grouped_packed_linear"):
        return None
    return PackedExperts(ops, weights.detach())


@functools.lru_cache(maxsize=4096)
def host_tensor(values: tuple[int, ...]) -> torch.Tensor:
    """A CPU int64 tensor of `values`, made once per distinct tuple: decode repeats the same
    few orders and offsets, and making a small tensor costs as much as the experts' GEMMs at
    one token. Shared: its users only read it."""
    return torch.tensor(values, dtype=torch.long)


def offsets_of(counts: Sequence[int]) -> torch.Tensor:
    """Row starts [E + 1] (int64, CPU, shared: read only) of groups with `counts` rows each."""
    return host_tensor((0, *itertools.accumulate(counts)))


def kernel_applies(x: torch.Tensor) -> bool:
    """Whether the grouped C++ kernels take these rows (CPU fp32, no autograd: they have no
    backward), else the layer runs its torch reference."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and not x.requires_grad
