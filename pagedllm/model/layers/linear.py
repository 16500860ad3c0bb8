"""Dense linear layer whose weight layout is chosen for the device.

Weights load in HF layout [out, in]; `finalize()` re-lays them once after loading:
  * CPU, fp32, C++ kernels built: packed into column panels for `packed_linear`
    (pagedllm/kernels/gemm_cpu.cpp), which reads the weight at full memory bandwidth when
    decoding few sequences and beats torch.mm at every batch size measured (1-1024 rows).
    Its results do not depend on the batch a row is in (batch-invariant).
  * CPU otherwise: stored transposed and contiguous; `x @ W_t` runs up to 2x faster than
    `F.linear` at the small batch sizes of decoding (../shared/BASELINES.md).
  * other devices: `F.linear` on the HF layout.
A quantized weight (`quant.QuantizedWeight`, adopted with `set_quantized`) replaces all of
these: its own kernel runs and the dense weight is never materialised.
Tensor parallelism (pagedllm/distributed/sharding.py) loads each rank's shard of the weight
and sets `parallel`: the collective that completes the layer's output (all-reduce after a
row-parallel o_proj / down_proj, all-gather of a vocab-parallel lm_head); None otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.quant import QuantizedWeight


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(out_features), requires_grad=False)
                     if bias else None)
        self.weight_t: torch.Tensor | None = None
        self.packed: torch.Tensor | None = None
        self.quant: QuantizedWeight | None = None
        self.lora = None  # pagedllm.lora.layer.LinearLoRA when LoRA is on: adds adapter deltas
        # Training (pagedllm.finetune) keeps the HF layout: F.linear has a backward for x.
        self.keep_dense = False
        self.parallel = None  # distributed.sharding hook: completes a tensor-parallel output

    def set_quantized(self, qweight: QuantizedWeight) -> None:
        """Adopt a quantized weight in place of the dense one (frees the dense storage)."""
        if qweight.shape != (self.out_features, self.in_features):
            raise ValueError(f"quantized weight {qweight!r} does not fit a linear layer of "
                             f"shape ({self.out_features}, {self.in_features})")
        self.quant = qweight
        self.weight = nn.Parameter(torch.empty(0, dtype=self.weight.dtype,
                                               device=self.weight.device), requires_grad=False)

    @property
    def weight_nbytes(self) -> int:
        """Bytes the weight (and bias) occupy in memory, in whatever layout it is held."""
        held = self.quant.nbytes if self.quant is not None else 0
        for t in (self.weight, self.weight_t, self.packed, self.bias):
            if t is not None:
                held += t.numel() * t.element_size()
        return held

    def finalize(self) -> None:
        """Called once after weights are loaded: pick the fastest layout for the device."""
        w = self.weight.detach()
        if self.quant is not None or w.device.type != "cpu" or self.keep_dense:
            return
        if (ops := cpu_ops.fp32_ops(w)) is not None:
            self.packed = ops.pack_linear_weight(w.contiguous())
        else:
            self.weight_t = w.t().contiguous()
        self.weight = nn.Parameter(torch.empty(0, dtype=w.dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._base_forward(x)
        if self.lora is not None:
            out = self.lora.add_delta(x, out)
        return out if self.parallel is None else self.parallel(out)

    def _base_forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quant is not None:
            if x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous():
                out = self.quant.linear(x)  # the common case: one kernel call, no reshapes
                return out if self.bias is None else out + self.bias
            lead = x.shape[:-1]
            out = self.quant.linear(x.reshape(-1, self.in_features).float().contiguous())
            if self.bias is not None:
                out = out + self.bias
            return out.view(*lead, self.out_features).to(x.dtype)
        if self.packed is not None:
            lead = x.shape[:-1]
            out = cpu_ops.load().packed_linear(x.reshape(-1, self.in_features).contiguous(),
                                               self.packed, self.out_features, self.bias)
            return out.view(*lead, self.out_features)
        if self.weight_t is not None:
            out = x @ self.weight_t
            return out + self.bias if self.bias is not None else out
        return F.linear(x, self.weight, self.bias)
