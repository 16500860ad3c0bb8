"""The dense (float) layouts of a linear layer's weight, one `LinearMethod` each.

Weights load in HF layout [out, in] into `Linear.weight`; `dense_method` picks the layout once
after loading (`Linear.finalize`):
  * CPU, fp32 model, linear weights asked for in bf16 (`--dtype bfloat16`, or `auto` on CPUs
    with bf16 matrix instructions: config/dtype.py): `Bf16Weight` (bf16.py), the weight
    stored once in bf16, fp32 activations. The dtype reaches each `Linear` at construction
    (`linear_weights(dtype)` around the model's construction, worker/model_setup.build_model).
  * CPU, fp32, C++ kernels built: `PackedWeight`, column panels for `packed_linear`
    (pagedllm/kernels/gemm_cpu.cpp), which reads the weight at full memory bandwidth when
    decoding few sequences and beats torch.mm at every batch size measured (1-1024 rows).
    Its results do not depend on the batch a row is in (batch-invariant).
  * CPU otherwise: `TransposedWeight`, stored transposed and contiguous; `x @ W_t` runs up to
    2x faster than `F.linear` at the small batch sizes of decoding (../shared/BASELINES.md).
  * other devices, and training (`keep_dense`: F.linear has a backward for x): `DenseWeight`,
    `F.linear` on the HF layout, which stays the layer's parameter.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.quant.base import LinearMethod
from pagedllm.model.layers.quant.bf16 import Bf16Weight

_LINEAR_DTYPE: ContextVar[torch.dtype | None] = ContextVar("linear_weight_dtype", default=None)


@contextmanager
def linear_weights(dtype: torch.dtype | None) -> Iterator[None]:
    """Linear layers constructed inside hold their weights in `dtype` once loaded (None: the
    model's own dtype). Read once by each layer (`linear_weight_dtype`) at construction."""
    token = _LINEAR_DTYPE.set(dtype)
    try:
        yield
    finally:
        _LINEAR_DTYPE.reset(token)


def linear_weight_dtype() -> torch.dtype | None:
    """The weight dtype a linear layer constructed now is to hold (None: the model's)."""
    return _LINEAR_DTYPE.get()

#: the packed layout's kind in the C++ decode loop (LinearKind in kernels/decode_layers_cpu.cpp)
PACKED_KIND = 0


class DenseWeight(LinearMethod):
    """The HF layout [out, in] run by `F.linear` (the layer's `weight` parameter itself)."""

    format = "dense"
    uses_layer_weight = True

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__(*weight.shape)
        self.weight = weight

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, self.weight, bias)

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()


class TransposedWeight(LinearMethod):
    """W^T [in, out], contiguous: `x @ W_t` (CPU without the packed kernel)."""

    format = "dense:transposed"

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__(*weight.shape)
        self.weight_t = weight.t().contiguous()

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        out = x @ self.weight_t
        return out + bias if bias is not None else out

    @property
    def nbytes(self) -> int:
        return self.weight_t.numel() * self.weight_t.element_size()


class PackedWeight(LinearMethod):
    """fp32 column panels of `packed_linear` (CPU with the C++ kernels)."""

    format = "dense:packed"

    def __init__(self, ops, weight: torch.Tensor) -> None:
        super().__init__(*weight.shape)
        self.packed = ops.pack_linear_weight(weight.contiguous())

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        lead = x.shape[:-1]
        out = cpu_ops.load().packed_linear(x.reshape(-1, self.in_features).contiguous(),
                                           self.packed, self.out_features, bias)
        return out.view(*lead, self.out_features)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()

    def fused_ref(self, ops, bias: torch.Tensor | None):
        return ops.LinearRef(PACKED_KIND, 0, self.out_features, self.in_features, 0,
                             [self.packed], bias)

    def unpacked(self) -> torch.Tensor:
        """The HF-layout weight [out, in] back from the [P, K, NB] panels."""
        p, k, nb = self.packed.shape
        return self.packed.transpose(1, 2).reshape(p * nb, k)[:self.out_features]


def bf16_table(weight: torch.Tensor, weight_dtype: torch.dtype | None) -> Bf16Weight | None:
    """A CPU fp32 matrix (a linear layer's weight, an embedding table) as bf16 when
    `weight_dtype` asks for bf16 matrices under an fp32 model; else None."""
    if (weight_dtype != torch.bfloat16 or weight.dtype != torch.float32
            or weight.device.type != "cpu" or weight.requires_grad):
        return None
    return Bf16Weight(cpu_ops.load(), weight.detach())


def dense_method(weight: torch.Tensor, keep_dense: bool,
                 weight_dtype: torch.dtype | None = None) -> LinearMethod:
    """The fastest layout of a loaded HF-layout weight on its device (module docstring);
    `weight_dtype` bf16 with an fp32 weight on CPU: bf16 weights, fp32 activations."""
    if weight.device.type != "cpu" or keep_dense:
        return DenseWeight(weight)
    w = weight.detach()
    if (table := bf16_table(w, weight_dtype)) is not None:
        return table
    if (ops := cpu_ops.fp32_ops(w)) is not None:
        return PackedWeight(ops, w)
    return TransposedWeight(w)
