"""Quantized experts stacked for the grouped kernels (grouped.py says what a `GroupedLinear` is).

Each format keeps its dense linear's layout, one more leading dimension over the E experts, so
one pointer + stride reaches expert e and each work item runs that linear's own per-panel code:

    gguf:T       GGUFWeight panels       q [E, P, K, RB], d / sc / m / mi [E, ...]
    gguf:T+a8    GGUFA8PanelWeight       codes [E, P, K / 32, lanes, NB, 4], d / m [E, ...]
    int8         Int8Weight              qp [E, P, K, NB] (W8A8: uint8 [E, P, K32 / 4, NB, 4]),
                                         scale [E, P * NB]

`stack_quantized(parts)` returns the stack and each expert's weight rebuilt as a view of it
(so the experts' bytes are held once), or None for parts the kernels cannot stack (mixed
formats or shapes, a format without a grouped kernel): the layer then loops over experts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.moe.grouped import GroupedLinear
from pagedllm.model.layers.quant import gguf, gguf_a8_panels
from pagedllm.model.layers.quant.base import QuantizedWeight
from pagedllm.model.layers.quant.gguf import GGUFWeight
from pagedllm.model.layers.quant.gguf_a8_panels import GGUFA8PanelWeight
from pagedllm.model.layers.quant.int8 import Int8Weight


def _stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """[E, ...] of same-shaped tensors; empty ones (a format's unused scales) stay empty."""
    if not tensors[0].numel():
        return tensors[0].new_empty((len(tensors), 0))
    return torch.stack(list(tensors))


class StackedQuantized(GroupedLinear):
    """The fields of E same-format weights, stacked; `call(xs, offsets, **fields)` is the
    format's grouped kernel. `ref`: (LinearRef kind, format code, row limit) of the formats
    the C++ decode loop runs (their fields in the kernel's argument order), else None."""

    def __init__(self, parts: Sequence[QuantizedWeight], fields: dict[str, torch.Tensor],
                 call: Callable[..., torch.Tensor],
                 ref: tuple[int, int, int] | None = None) -> None:
        super().__init__(len(parts), parts[0].out_features, parts[0].in_features)
        self.fields, self.call, self.ref = fields, call, ref

    def fused_ref(self, ops):
        if self.ref is None:
            return None
        kind, code, rows = self.ref
        return ops.ExpertsRef(kind, code, self.out_features, self.in_features, rows,
                              list(self.fields.values()))

    def run(self, xs: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.call(xs, offsets, **self.fields)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.fields.values())


def _gguf(parts: Sequence[GGUFWeight]) -> tuple[GroupedLinear, list[QuantizedWeight]]:
    first = parts[0]
    fields = {key: _stack([getattr(p, key) for p in parts]) for key in ("q", "d", "sc", "m", "mi")}
    ops, code, n = gguf.kernels(), first.spec.code, first.out_features

    def call(xs, offsets, q, d, sc, m, mi):
        return ops.gguf_grouped_linear(xs, code, n, q, d, sc, m, mi, offsets,
                                       gguf.IN_REGISTER_ROWS)

    views = [GGUFWeight(first.qtype, n, first.in_features,
                        {key: t[e] if t.numel() else getattr(first, key)
                         for key, t in fields.items()}, first.nb_cols)
             for e in range(len(parts))]
    ref = (gguf.FUSED_KIND, code, gguf.IN_REGISTER_ROWS)
    return StackedQuantized(parts, fields, call, ref), views


def _a8_panels(parts: Sequence[GGUFA8PanelWeight]) -> tuple[GroupedLinear,
                                                           list[QuantizedWeight]]:
    first = parts[0]
    fields = {key: _stack([getattr(p, key) for p in parts]) for key in ("codes", "d", "m")}
    ops, code, n = gguf_a8_panels.kernels(), first.code, first.out_features

    def call(xs, offsets, codes, d, m):
        return ops.a8_panel_grouped_linear(xs, code, codes, d, m, n, offsets)

    views = [GGUFA8PanelWeight(first.qtype, n, first.in_features, fields["codes"][e],
                               fields["d"][e], fields["m"][e] if first.m.numel() else first.m)
             for e in range(len(parts))]
    return StackedQuantized(parts, fields, call, (gguf_a8_panels.FUSED_KIND, code, 0)), views


def _int8(parts: Sequence[Int8Weight]) -> tuple[GroupedLinear, list[QuantizedWeight]]:
    first = parts[0]
    fields = {"qp": torch.stack([p.qp for p in parts]),
              "scale": torch.stack([p.scale for p in parts])}
    ops, n, w8a8 = cpu_ops.load_int(), first.out_features, first.w8a8

    def call(xs, offsets, qp, scale):
        if w8a8:
            return ops.w8a8_grouped_linear(xs, qp, scale, n, offsets)
        return ops.int8_grouped_linear(xs, qp, scale, n, offsets, -1)

    views = [Int8Weight.from_packed(first, fields["qp"][e], fields["scale"][e])
             for e in range(len(parts))]
    return StackedQuantized(parts, fields, call), views


def _built(parts: Sequence[QuantizedWeight]) -> bool:
    """Whether the grouped kernel of `parts`' format is built on this machine."""
    first = parts[0]
    if isinstance(first, Int8Weight):
        ops = cpu_ops.load_int()
        if ops is None or first.nb != ops.quant_panel_width():
            return False
        if first.w8a8:  # codes packed for this build's dot product (int8.py's linear)
            return (hasattr(ops, "w8a8_grouped_linear")
                    and first.code_offset == ops.w8a8_code_offset())
        return hasattr(ops, "int8_grouped_linear")
    ops, name = {GGUFWeight: (gguf.kernels, "gguf_grouped_linear"),
                 GGUFA8PanelWeight: (gguf_a8_panels.kernels, "a8_panel_grouped_linear"),
                 }[type(first)]
    return hasattr(ops(), name)


# format class -> its stacker
_STACKERS: dict[type, Callable] = {GGUFWeight: _gguf, GGUFA8PanelWeight: _a8_panels,
                                   Int8Weight: _int8}


def _same_layout(parts: Sequence[QuantizedWeight]) -> bool:
    first = parts[0]
    return (len({type(p) for p in parts}) == 1 and len({p.format for p in parts}) == 1
            and len({(getattr(p, "w8a8", False), getattr(p, "code_offset", 0))
                     for p in parts}) == 1
            and all(p.shape == first.shape for p in parts))


def stack_quantized(parts: Sequence[QuantizedWeight]
                    ) -> tuple[GroupedLinear, list[QuantizedWeight]] | None:
    """(the grouped stack of `parts`, each part as a view of it), or None (module doc)."""
    if not parts or not _same_layout(parts):
        return None
    stacker = _STACKERS.get(type(parts[0]))
    if stacker is None or not _built(parts):
        return None
    return stacker(parts)
