"""How a MoE layer's routed experts run, chosen per call from the tensors:

    the Triton fused-MoE    CUDA (or the interpreter when forced: kernels/triton's `enabled`),
    kernel                  experts held dense (finalize does not pack them for the grouped
                            C++ kernels where Triton is enabled: moe/grouped.py's
                            `packed_experts`); under expert parallelism the ids of experts
                            held by other ranks become -1, which the kernel skips (no host
                            read, no gather)
    StackedExperts.forward  everything else (the CPU path: grouped C++ kernels, fp32 packed or
                            quantized, or its per-expert reference loop); under expert
                            parallelism only the assignments routed to the experts held here
                            run (their tokens gathered, ids made local, k = 1) and their
                            outputs are added to their tokens' rows

Expert parallelism: this rank holds experts [first, first + n) of the layer's E; the other
ranks add theirs in the MoE block's all-reduce. Every path has the same contract: x [T, H],
weights / ids [T, k] -> sum_k weight * expert(x) over the experts held here.
"""

from __future__ import annotations

import torch

from pagedllm.kernels import triton as triton_kernels
from pagedllm.model.layers.moe.experts import StackedExperts


def run_experts(experts: StackedExperts, x: torch.Tensor, weights: torch.Tensor,
                ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The weighted sum of the held experts' outputs for every token of x (`num_experts`:
    the layer's, which `experts` holds all of but under expert parallelism)."""
    sharded = experts.num_experts != num_experts
    triton = experts.dense and triton_kernels.enabled(x)
    if not sharded and not triton:
        return experts(x, weights, ids)
    local = ids - experts.first_expert
    held = (local >= 0) & (local < experts.num_experts)
    if triton:
        from pagedllm.kernels.triton.fused_moe import fused_moe

        if sharded:
            local = torch.where(held, local, -1)
        return fused_moe(x.contiguous(), experts.gate_up_proj, experts.down_proj, weights,
                         local)
    rows = held.reshape(-1).nonzero().squeeze(1)  # assignments t * k + j held here
    out = torch.zeros_like(x)
    if rows.numel():
        tokens = rows // ids.shape[1]
        part = experts(x.index_select(0, tokens),
                       weights.reshape(-1).index_select(0, rows).unsqueeze(1),
                       local.reshape(-1).index_select(0, rows).unsqueeze(1))
        out.index_add_(0, tokens, part)
    return out
