"""Which implementation runs a MoE layer's routed experts, chosen per call from the tensors:

    the Triton fused-MoE kernel    CUDA (or the interpreter when forced: kernels/triton's
                                   `enabled`), experts held dense
    StackedExperts.forward         everything else (the CPU path, quantized experts)

Both have the same contract: x [T, H], weights / ids [T, k] -> sum_k weight * expert(x).
"""

from __future__ import annotations

import torch

from pagedllm.kernels import triton as triton_kernels
from pagedllm.model.layers.moe.experts import StackedExperts


def run_experts(experts: StackedExperts, x: torch.Tensor, weights: torch.Tensor,
                ids: torch.Tensor) -> torch.Tensor:
    """The routed experts' weighted sum for every token of x."""
    if experts.quant is None and triton_kernels.enabled(x):
        from pagedllm.kernels.triton.fused_moe import fused_moe

        return fused_moe(x.contiguous(), experts.gate_up_proj, experts.down_proj, weights, ids)
    return experts(x, weights, ids)
