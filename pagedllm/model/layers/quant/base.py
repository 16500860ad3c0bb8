"""The contract of a linear layer's weight: a `LinearMethod` per format, `QuantizedWeight` for
the formats that stay quantized in memory.

`Linear` holds one `LinearMethod`: it owns the weight's layout and the kernel that multiplies
by it, and answers three questions, so that model code never asks which format it holds:

    apply(x[..., K], bias)  ->  y[..., N]    (the kernel call; y in x's dtype)
    nbytes                                   (what the weight occupies: start-up log, plan)
    fused_ref(ops, bias)    ->  ops.LinearRef or None   (its form in the C++ decode loop,
                                                          model/fused_decode.py)

The dense layouts are in dense.py; each quantized format is one `QuantizedWeight` subclass in
its own file. A `QuantizedWeight` is logically a float matrix W[out_features, in_features]
(HF layout, y = x @ W^T) held in whatever packed layout its kernel wants (repacked once at
load time). Loaders hand these to the model in place of dense tensors; `Linear.set_quantized`
adopts one; fused projections (q|k|v, gate|up) are built from per-projection parts with
`concat_quantized`, which stacks them along the output dimension.

    Linear.forward(x[..., K])  ->  qweight.linear(x[M, K] fp32, contiguous)  ->  y[M, N] fp32
                                   (+ bias, added by `apply`)

`dequantize()` is the reference every kernel is tested against, and `nbytes` is what the
weight really occupies in memory (start-up log, KV budget, `pagedllm plan`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch


class LinearMethod(abc.ABC):
    """One linear layer's weight in one layout, and the kernel that multiplies by it.

    The bias stays a parameter of the layer (checkpoints name it there) and is handed to
    `apply` and `fused_ref`; a method may be shared by two layers (a tied lm_head adopts the
    embedding's quantized table), so it holds nothing of one layer but the weight.
    """

    #: the name of the format, e.g. "dense:packed", "gguf:Q4_1", "awq", "gptq", "int8"
    format: ClassVar[str] = "linear"
    #: True when the method's storage is the layer's own `weight` parameter (counted with
    #: the parameters); False when the method holds its weight apart (counted by `nbytes`)
    uses_layer_weight: ClassVar[bool] = False

    def __init__(self, out_features: int, in_features: int) -> None:
        self.out_features = int(out_features)
        self.in_features = int(in_features)

    @property
    def shape(self) -> tuple[int, int]:
        """The logical (out_features, in_features) of the dense weight it stands for."""
        return (self.out_features, self.in_features)

    @abc.abstractmethod
    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """y = x @ W^T (+ bias) for x [..., in_features]: [..., out_features] in x's dtype."""

    @property
    @abc.abstractmethod
    def nbytes(self) -> int:
        """Bytes this weight occupies in memory (packed data, scales, zeros, ...)."""

    def fused_ref(self, ops, bias: torch.Tensor | None):
        """This weight as the C++ decode loop takes it (`ops.LinearRef`, kinds in
        kernels/decode_layers_cpu.cpp), or None when the loop has no kernel for it."""
        return None

    def gated_mlp(self, down: LinearMethod, x: torch.Tensor) -> torch.Tensor | None:
        """down(silu(gate) * up) for x, this weight the fused [gate | up] matrix, in one kernel
        call where this format has one for `down` (and x), else None (the caller runs the three
        steps)."""
        return None

    def relocate(self, place: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Replace every tensor this method holds by `place(tensor)`, a tensor of the same
        values (`relocate_fields`): how worker/weight_arena.py moves the weights into one
        huge-page mapping after loading. A method that caches something derived from its
        tensors outside Python (none does today) overrides this."""
        relocate_fields(self, place)


def relocate_fields(holder: object, place: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Replace every tensor among `holder`'s attributes, directly or in a list or tuple, by
    `place(tensor)`, and relocate every object there that has a `relocate(place)` of its own
    (a LinearMethod, MoE experts): the one walk each weight holder's `relocate` runs."""
    def moved(value):
        if isinstance(value, torch.Tensor):
            return place(value)
        if isinstance(value, (list, tuple)):
            return type(value)(moved(v) for v in value)
        if not isinstance(value, type) and callable(getattr(value, "relocate", None)):
            value.relocate(place)
        return value

    for name, value in list(vars(holder).items()):
        setattr(holder, name, moved(value))


class QuantizedWeight(LinearMethod):
    """One linear layer's weight in a quantized format (see the module docstring)."""

    format: ClassVar[str] = "quantized"

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous():
            out = self.linear(x)  # the common case: one kernel call, no reshapes
            return out if bias is None else out + bias
        lead = x.shape[:-1]
        out = self.linear(x.reshape(-1, self.in_features).float().contiguous())
        if bias is not None:
            out = out + bias
        return out.view(*lead, self.out_features).to(x.dtype)

    @abc.abstractmethod
    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """y = x @ W^T for a contiguous float32 x of shape [M, in_features]; returns
        [M, out_features] float32 (no bias)."""

    @abc.abstractmethod
    def dequantize(self) -> torch.Tensor:
        """The dense float32 weight [out_features, in_features] (the kernels' reference)."""

    @classmethod
    def concat(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        """Stack same-format parts along the output dimension (fused q|k|v, gate|up).

        Formats whose layout cannot be concatenated raise NotImplementedError; callers then
        fall back to `concat_quantized`'s error message.
        """
        raise NotImplementedError(f"{cls.__name__} cannot be concatenated")

    def embedding(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Rows W[token_ids] as float32 [len(token_ids), in_features]: an embedding table kept
        quantized dequantizes only the rows it looks up. Formats override this with a kernel;
        the default dequantizes the whole matrix (correct, slow)."""
        return self.dequantize()[token_ids]

    def embedding_ref(self, ops):
        """This table as the C++ multi-step decode looks rows up (`ops.EmbedRef`,
        kernels/decode_layers_cpu.cpp): the same rows as `embedding`; None when its format has
        no C++ rows kernel there (then decode steps run one at a time)."""
        return None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.format}, out={self.out_features}, "
                f"in={self.in_features}, {self.nbytes / 2**20:.2f} MiB)")


class StackedQuantizedWeight(QuantizedWeight):
    """Parts that cannot be merged into one layout (different formats: a GGUF Q4_K_M file
    stores some v projections as Q6_K next to Q4_K q and k): each part runs its own kernel
    and the outputs are concatenated along the output dimension."""

    format = "stacked"

    def __init__(self, parts: Sequence[QuantizedWeight]) -> None:
        super().__init__(sum(p.out_features for p in parts), parts[0].in_features)
        self.parts = list(parts)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p.linear(x) for p in self.parts], dim=-1)

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts], dim=0)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def __repr__(self) -> str:
        return f"StackedQuantizedWeight({', '.join(map(repr, self.parts))})"


def concat_quantized(parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
    """One weight for a fused projection: the format's own `concat` when every part has the
    same format and it supports that, else a `StackedQuantizedWeight` of the parts."""
    if not parts:
        raise ValueError("concat_quantized: no parts")
    ins = {p.in_features for p in parts}
    if len(ins) != 1:
        raise ValueError(f"cannot fuse quantized weights with different in_features {sorted(ins)}")
    if len(parts) == 1:
        return parts[0]
    if len({type(p) for p in parts}) == 1 and len({p.format for p in parts}) == 1:
        try:
            return type(parts[0]).concat(parts)
        except NotImplementedError:
            pass
    return StackedQuantizedWeight(parts)
