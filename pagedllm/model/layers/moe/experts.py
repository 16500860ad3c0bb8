"""The experts of a MoE layer, stored stacked, run over tokens grouped by expert.

    gate_up_proj [E, 2I, H]  (each expert's gate rows, then its up rows)
    down_proj    [E, H, I]

This is HF transformers' in-memory layout (5.x `*Experts` modules), so a checkpoint saved in
it loads as is; per-expert checkpoint tensors (`experts.{e}.gate_proj` / `w1`, ...) are
copied into their expert's slice by `load_expert`.

One forward over T tokens routed to k experts each:

    flat ids [T*k] --stable sort--> order      sorted[j] = assignment order[j]
                                               (token order[j] // k, expert ids.flat[order[j]])
    xs = x[order // k]                         [T*k, H], the rows of expert 0, then 1, ...
    counts = bincount(ids, E)                  one host read per layer
    h = silu(gate) * up of gate_up(xs)         one grouped GEMM over all groups of rows
    out = down(h)                              one more: out[g] = down_e(act(gate_up_e(xs[g])))
    out *= weights.flat[order]
    y = zeros[T, H].index_add_(0, order // k, out)     the weighted combine

Rows are added in ascending expert order, the order HF's per-expert loop adds them.

`finalize` (after loading) stacks each projection for the grouped C++ kernels
(grouped.py; kernels/grouped_cpu.h): one call per projection runs every expert's rows, no
Python loop per expert. fp32 experts get fp32 panels; bf16 experts (`--dtype bfloat16` or
auto's bf16 on CPU, read at construction like the linear layers' weight dtype, or a model
loaded in bfloat16) are held in the panels of the grouped bf16 kernel (grouped_bf16.py),
which takes fp32 rows: bf16 activations are widened at the entry and the result rounded
back, so bf16 weights serve both an all-bf16 model and one with fp32 activations. (Where
Triton is enabled, dense experts stay dense: moe/dispatch.py runs them with the Triton
fused-MoE kernel instead of this forward.) Where they do not apply (another device, autograd, mixed quantized
formats) `reference` runs one GEMM pair per expert in torch; the grouped kernels are tested
equal to it.

Experts whose checkpoint weights arrive quantized (`QuantizedWeight`: GGUF blocks, int8 made
at load, ...) stay so: `finalize` fuses each expert's gate and up and frees the dense storage
(`QuantizedExperts`), and the grouped kernel of their format runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from pagedllm.model.layers.activation import silu_and_mul
from pagedllm.model.layers.moe.grouped import (
    GroupedLinear,
    PackedExperts,
    host_tensor,
    kernel_applies,
    offsets_of,
    packed_experts,
)
from pagedllm.model.layers.moe.grouped_bf16 import Bf16Experts, bf16_experts
from pagedllm.model.layers.moe.grouped_quant import stack_quantized
from pagedllm.model.layers.quant import QuantizedWeight, concat_quantized
from pagedllm.model.layers.quant.base import relocate_fields
from pagedllm.model.layers.quant.dense import linear_weight_dtype

EXPERT_PARTS = ("gate", "up", "down")


@dataclass
class QuantizedExperts:
    """Every expert's weights in a quantized format: gate|up fused, and down."""

    gate_up: list[QuantizedWeight]
    down: list[QuantizedWeight]
    #: both projections stacked for the grouped kernels (None: the format has none)
    grouped: tuple[GroupedLinear, GroupedLinear] | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of all experts (what worker/model_setup.weight_bytes counts as `quant`)."""
        return sum(w.nbytes for w in (*self.gate_up, *self.down))

    @property
    def format(self) -> str:
        return self.down[0].format

    def relocate(self, place: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Every expert's tensors (and the grouped stacks') replaced by `place(tensor)`
        (worker/weight_arena.py)."""
        relocate_fields(self, place)


DenseGrouped = PackedExperts | Bf16Experts


def dense_grouped(weights: torch.Tensor) -> DenseGrouped | None:
    """Float stacked experts [E, N, K] packed for the grouped kernel of their dtype (fp32:
    grouped.PackedExperts, bf16: grouped_bf16.Bf16Experts), or None (the reference runs)."""
    if weights.dtype == torch.bfloat16:
        return bf16_experts(weights)
    return packed_experts(weights)


def group_by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, list[int]]:
    """(order [T*k]: assignments sorted by expert id, stable; tokens per expert [E])."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return order, counts.tolist()


#: assignments (tokens x k) up to which `forward` groups them on the host (decode batches)
SMALL_BATCH = 16


def group_small(flat: list[int], num_experts: int) -> list[int]:
    """`group_by_expert`'s order for a host list of expert ids: assignments sorted by expert
    id, stable (Python's sort is); an id outside [0, num_experts) is an error."""
    if any(not 0 <= e < num_experts for e in flat):
        raise ValueError(f"expert ids {flat} are not all in [0, {num_experts})")
    return sorted(range(len(flat)), key=flat.__getitem__)


class StackedExperts(nn.Module):
    """E SwiGLU experts of hidden size H and width I (see the module doc): the layer's experts
    [first_expert, first_expert + num_experts) (all of them but under expert parallelism,
    where each rank holds its share; `forward` takes ids in [0, num_experts))."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 first_expert: int = 0) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.first_expert = first_expert
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.down_proj = nn.Parameter(
            torch.empty(num_experts, hidden_size, intermediate_size), requires_grad=False
        )
        self._quantized: dict[tuple[int, str], QuantizedWeight] = {}
        self.quant: QuantizedExperts | None = None  # set by finalize for quantized weights
        # fp32 / bf16 experts stacked for their grouped kernel (set by finalize on CPU)
        self.packed: tuple[DenseGrouped, DenseGrouped] | None = None
        # the dtype dense experts are held in once loaded, as for the model's linear layers
        # (quant/dense.linear_weights: bf16 on CPU under `--dtype bfloat16` / auto; None: as
        # loaded)
        self.weight_dtype = linear_weight_dtype()

    def finalize(self, weight_dtype: torch.dtype | None = None) -> None:
        """Called once after loading: fp32 and bf16 experts are packed for the grouped kernel
        of their dtype (the dense storage freed), experts loaded quantized become `quant`
        (gate and up fused per expert, stacked for their format's grouped kernel); all or none
        must be quantized.

        `weight_dtype` holds dense experts in another float dtype than they were loaded in
        (None: the dtype the layer was constructed under, `linear_weight_dtype`, else as
        loaded): bfloat16 on an fp32 model is the CPU regime of bf16 weights with fp32
        activations, which the grouped bf16 kernel runs as it is."""
        weight_dtype = weight_dtype or self.weight_dtype
        if not self._quantized:
            if weight_dtype is not None:
                self._convert_dense(weight_dtype)
            gate_up, down = dense_grouped(self.gate_up_proj), dense_grouped(self.down_proj)
            if gate_up is not None and down is not None:
                self.packed = (gate_up, down)
                self.register_buffer("packed_gate_up", gate_up.packed, persistent=False)
                self.register_buffer("packed_down", down.packed, persistent=False)
                self._free_dense()
            return
        want = {(e, p) for e in range(self.num_experts) for p in EXPERT_PARTS}
        if set(self._quantized) != want:
            missing = sorted(want - set(self._quantized))[:4]
            raise ValueError(f"expert weights are partly quantized: {missing} are not")
        q = self._quantized
        gate_up = [concat_quantized([q[e, "gate"], q[e, "up"]]) for e in range(self.num_experts)]
        down = [q[e, "down"] for e in range(self.num_experts)]
        stacked_gate_up, stacked_down = stack_quantized(gate_up), stack_quantized(down)
        if stacked_gate_up is not None and stacked_down is not None:
            self.quant = QuantizedExperts(
                stacked_gate_up[1], stacked_down[1], (stacked_gate_up[0], stacked_down[0])
            )
        else:
            self.quant = QuantizedExperts(gate_up, down)
        self._quantized = {}
        self._free_dense()

    def _convert_dense(self, dtype: torch.dtype) -> None:
        if not dtype.is_floating_point:
            raise ValueError(f"experts' weight_dtype must be a float dtype, got {dtype}")
        for name in ("gate_up_proj", "down_proj"):
            old = getattr(self, name)
            if old.dtype != dtype:
                setattr(self, name, nn.Parameter(old.detach().to(dtype), requires_grad=False))

    def _free_dense(self) -> None:
        for name in ("gate_up_proj", "down_proj"):
            old = getattr(self, name)
            setattr(
                self,
                name,
                nn.Parameter(
                    torch.empty(0, dtype=old.dtype, device=old.device), requires_grad=False
                ),
            )

    @torch.no_grad()
    def load_expert(self, expert: int, part: str, tensor: torch.Tensor | QuantizedWeight) -> None:
        """Copy one expert's HF weight ([I, H] for gate / up, [H, I] for down) into place, or
        keep it as it is when quantized (`finalize` assembles those). `expert` is the
        layer's expert id (held here: [first_expert, first_expert + num_experts))."""
        first = self.first_expert
        if not first <= expert < first + self.num_experts:
            raise ValueError(f"expert {expert} is outside this layer's experts "
                             f"[{first}, {first + self.num_experts})")
        expert -= first
        inter = self.intermediate_size
        if part == "down":
            target = self.down_proj[expert]
        elif part in ("gate", "up"):
            start = 0 if part == "gate" else inter
            target = self.gate_up_proj[expert, start : start + inter]
        else:
            raise ValueError(f"expert weight part {part!r} is not one of {EXPERT_PARTS}")
        if isinstance(tensor, QuantizedWeight):
            if tensor.shape != tuple(target.shape):
                raise ValueError(
                    f"quantized expert {expert} {part} weight {tensor!r} does not fit "
                    f"{tuple(target.shape)}"
                )
            self._quantized[expert, part] = tensor
            return
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"expert {expert} {part} weight has shape {tuple(tensor.shape)}; "
                f"the layer expects {tuple(target.shape)}"
            )
        target.copy_(tensor)

    @property
    def dense(self) -> bool:
        """Whether the weights are held in the dense stacks `gate_up_proj` / `down_proj` (not
        quantized, not packed for the grouped kernels): what the Triton kernel reads."""
        return self.quant is None and self.packed is None

    @property
    def bf16(self) -> bool:
        """Whether the experts are held in the grouped bf16 kernel's panels (fp32 rows in)."""
        return self.packed is not None and isinstance(self.packed[0], Bf16Experts)

    @property
    def weight_nbytes(self) -> int:
        """Bytes the experts' weights occupy, in whatever format they are held."""
        if self.quant is not None:
            return self.quant.nbytes
        if self.packed is not None:
            return sum(p.nbytes for p in self.packed)
        return self.gate_up_proj.nbytes + self.down_proj.nbytes

    @property
    def grouped(self) -> tuple[GroupedLinear, GroupedLinear] | None:
        """(gate_up, down) stacked for the grouped kernels, or None (the reference loop runs)."""
        return self.quant.grouped if self.quant is not None else self.packed

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """sum over each token's k experts of weight * expert(x): x [T, H], weights / ids
        [T, k] -> [T, H]. Each token's rows are added in expert order (`index_add_`; the
        small-batch path's `sum(0)` of one token's rows adds them in the same order), as the
        C++ MoE block (kernels/moe_decode_cpu.h) does: they agree to the bit.
        bf16 x on bf16-packed experts runs as fp32 rows (the kernel's input), the result
        rounded back to bf16."""
        if x.dtype == torch.bfloat16 and self.bf16 and not x.requires_grad:
            return self.forward(x.float(), weights, ids).to(x.dtype)
        grouped = self.grouped
        if grouped is not None and 0 < ids.numel() <= SMALL_BATCH and kernel_applies(x):
            return self._forward_small(x, weights, ids, grouped)
        k = ids.shape[1]
        order, counts = group_by_expert(ids, self.num_experts)
        tokens = order // k
        xs = x.index_select(0, tokens)
        if grouped is not None and kernel_applies(xs):
            offsets = offsets_of(counts)
            h = silu_and_mul(grouped[0].run(xs.contiguous(), offsets))
            out = grouped[1].run(h, offsets)
        else:
            out = self.reference(xs, counts)
        out.mul_(weights.reshape(-1).index_select(0, order).unsqueeze(1).to(out.dtype))
        return torch.zeros_like(x).index_add_(0, tokens, out)

    def _forward_small(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                       grouped: tuple[GroupedLinear, GroupedLinear]) -> torch.Tensor:
        """`forward` for a few assignments (decode), the same sums in the same order: the
        grouping is done on the host from one read of the ids (the general path's argsort,
        bincount, cumsum and their small tensors cost more than the experts' GEMMs at one
        token), and one token's rows are summed without the zeros + index_add_."""
        k = ids.shape[1]
        flat = ids.reshape(-1).tolist()
        order = group_small(flat, self.num_experts)
        order_t = host_tensor(tuple(order))
        if x.shape[0] == 1:
            xs = x.expand(len(order), -1).contiguous()
        else:
            tokens = order_t // k
            xs = x.index_select(0, tokens)
        counts = [0] * self.num_experts
        for e in flat:
            counts[e] += 1
        offsets = offsets_of(counts)
        h = silu_and_mul(grouped[0].run(xs, offsets))
        out = grouped[1].run(h, offsets)
        w = weights.reshape(-1, 1)
        if order != sorted(order):  # else already in expert order (k = 1, ids ascending)
            w = w.index_select(0, order_t)
        out.mul_(w.to(out.dtype))
        if x.shape[0] == 1:
            return out.sum(0, keepdim=True)
        return torch.zeros_like(x).index_add_(0, tokens, out)

    def reference(self, xs: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """The experts over rows sorted by expert (`counts` rows each), one torch GEMM pair
        (or quantized linear pair) per expert: for devices and dtypes without the grouped
        kernels, and the reference they are tested against."""
        out = torch.empty_like(xs)
        start = 0
        for expert, n in enumerate(counts):
            if n == 0:
                continue
            rows = slice(start, start + n)
            if self.quant is not None:
                h = silu_and_mul(self.quant.gate_up[expert].apply(xs[rows], None))
                out[rows] = self.quant.down[expert].apply(h, None)
            else:
                gate_up, down = self._dense(expert)
                h = silu_and_mul(torch.mm(xs[rows], gate_up.t().to(xs.dtype)))
                out[rows] = torch.mm(h, down.t().to(xs.dtype))
            start += n
        return out

    def _dense(self, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert `expert`'s (gate_up [2I, H], down [H, I]) in HF layout."""
        if self.packed is None:
            return self.gate_up_proj[expert], self.down_proj[expert]
        return self.packed[0].dense(expert), self.packed[1].dense(expert)
