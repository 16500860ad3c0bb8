"""A linear layer that holds one `LinearMethod`: the weight's layout and its kernel.

    Linear.forward(x) = parallel(method.apply(x, bias))

Weights load in HF layout [out, in] into `weight` (the loaders' target, named as in the
checkpoint); `finalize()` then picks the dense layout for the device once
(`quant.dense.dense_method`: packed panels, transposed, the HF layout itself, or bf16 weights
under fp32 activations when the layer was constructed inside `quant.dense.linear_weights`). A
quantized weight (`quant.QuantizedWeight`, adopted with `set_quantized`) is the method instead:
its own kernel runs and the dense weight is never materialised. Model code never asks which format a
layer holds: the method answers `apply`, `nbytes` and `fused_ref` (quant/base.py).
Under tensor parallelism each rank loads its shard of the weight
(pagedllm/distributed/sharding.py) and `parallel` is the collective that completes the layer's
output, taken at construction from what the model code declares (`combine="sum"`: all-reduce
after a row-parallel o_proj / down_proj; `"vocab"`: all-gather of a vocab-parallel lm_head;
layers/parallel.py); None on one rank.
LoRA wraps the layer from outside (pagedllm/lora/layer.py `LoRALinear`): this layer knows
nothing of it.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.model.layers.parallel import Combine, output_collective
from pagedllm.model.layers.quant import LinearMethod, QuantizedWeight
from pagedllm.model.layers.quant.dense import dense_method, linear_weight_dtype


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 combine: Combine | None = None) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(out_features), requires_grad=False)
                     if bias else None)
        self.method: LinearMethod | None = None  # set by set_quantized() or finalize()
        # Training (pagedllm.finetune) keeps the HF layout: F.linear has a backward for x.
        self.keep_dense = False
        # bf16 on CPU under an fp32 model (quant/dense.py `linear_weights`); None: the model's
        self.weight_dtype = linear_weight_dtype()
        self.parallel = output_collective(combine)  # completes a tensor-parallel output

    def set_quantized(self, qweight: QuantizedWeight) -> None:
        """Adopt a quantized weight as the method (frees the dense storage)."""
        if qweight.shape != (self.out_features, self.in_features):
            raise ValueError(f"quantized weight {qweight!r} does not fit a linear layer of "
                             f"shape ({self.out_features}, {self.in_features})")
        self.method = qweight
        self._free_dense()

    def finalize(self) -> None:
        """Called once after weights are loaded: pick the fastest dense layout for the device
        (a layer that adopted a quantized weight keeps it)."""
        if self.method is not None:
            return
        self.method = dense_method(self.weight, self.keep_dense, self.weight_dtype)
        if not self.method.uses_layer_weight:
            self._free_dense()

    def _free_dense(self) -> None:
        self.weight = nn.Parameter(torch.empty(0, dtype=self.weight.dtype,
                                               device=self.weight.device), requires_grad=False)

    @property
    def quant(self) -> LinearMethod | None:
        """The method when it holds the weight apart from this layer's parameters (every
        format but the HF layout), else None: what worker/model_setup.weight_bytes counts by
        `nbytes`, next to the parameters it counts itself."""
        m = self.method
        return None if m is None or m.uses_layer_weight else m

    @property
    def weight_nbytes(self) -> int:
        """Bytes the weight (and bias) occupy in memory, in whatever layout it is held."""
        held = (self.method.nbytes if self.method is not None
                else self.weight.numel() * self.weight.element_size())
        return held + (self.bias.numel() * self.bias.element_size() if self.bias is not None
                       else 0)

    def fused_ref(self, ops):
        """This layer in the C++ decode loop (model/fused_decode.py), or None when it cannot
        run there (no kernel for its format, or a tensor-parallel collective)."""
        if self.parallel is not None or self.method is None:
            return None
        return self.method.fused_ref(ops, self.bias)

    def gated_mlp(self, down: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """down(silu(gate) * up) for x, this layer the fused [gate | up] projection, in one
        kernel call where both layers are plain (no bias, no collective, `down` not wrapped,
        e.g. by LoRA) and this layer's method has such a kernel; else None."""
        if (not isinstance(down, Linear) or self.parallel is not None or down.parallel is not None
                or self.bias is not None or down.bias is not None):
            return None
        return self.method.gated_mlp(down.method, x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.method.apply(x, self.bias)
        return out if self.parallel is None else self.parallel(out)
