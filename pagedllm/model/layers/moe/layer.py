"""A mixture-of-experts block, used in place of a decoder layer's MLP:

    y = sum_k w_k * expert_{id_k}(x)              router: gate(x) -> select_experts
      + sigmoid(x W_g) * shared_expert(x)         where the family has one (Qwen2-MoE: gated)

Under tensor parallelism (distributed/expert_sharding.py) the router is replicated, the
experts are split by width or held whole per rank (expert parallelism, `local_experts`), the
shared expert by width, and one all-reduce completes the block.

Parameter names follow HF's (`gate` is the router, `experts`, `shared_expert`,
`shared_expert_gate`), so checkpoints map onto them like any layer's.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.activation import silu_and_mul
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.moe.dispatch import run_experts
from pagedllm.model.layers.moe.experts import StackedExperts
from pagedllm.model.layers.moe.grouped import kernel_applies
from pagedllm.model.layers.moe.router import RouterSpec, select_experts
from pagedllm.model.layers.moe.spec import MoESpec
from pagedllm.model.layers.parallel import local_experts, output_collective


class SharedExpert(nn.Module):
    """A SwiGLU MLP that every token goes through (gate and up fused, as in Llama's MLP)."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size)
        self.down_proj = Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class FusedMoE(nn.Module):
    """Router + stacked experts (+ shared expert) over a flattened token batch [T, H].

    `expert_bias` (DeepSeek-V3's `e_score_correction_bias`) is a parameter only when
    `with_expert_bias`; it steers which experts are chosen, not their weights.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        router: RouterSpec,
        shared_intermediate_size: int = 0,
        shared_expert_gate: bool = False,
        with_expert_bias: bool = False,
    ) -> None:
        super().__init__()
        self.router = router
        self.gate = Linear(hidden_size, router.num_experts)
        first, end = local_experts(router.num_experts)  # all but under expert parallelism
        self.experts = StackedExperts(end - first, hidden_size, intermediate_size, first)
        # Under tensor parallelism routed and shared experts each leave a partial sum: one
        # all-reduce completes both (None on one rank).
        self.parallel = output_collective("sum")
        self.expert_bias = (
            nn.Parameter(torch.zeros(router.num_experts), requires_grad=False)
            if with_expert_bias
            else None
        )
        self.shared_expert = (
            SharedExpert(hidden_size, shared_intermediate_size)
            if shared_intermediate_size
            else None
        )
        self.shared_expert_gate = Linear(hidden_size, 1) if shared_expert_gate else None
        if shared_expert_gate and self.shared_expert is None:
            raise ValueError(
                "a shared expert gate needs a shared expert (shared_intermediate_size > 0)"
            )

    @classmethod
    def from_spec(cls, spec: MoESpec) -> FusedMoE:
        return cls(
            spec.hidden_size,
            spec.intermediate_size,
            spec.router,
            spec.shared_intermediate_size,
            spec.shared_expert_gate,
            spec.expert_bias,
        )

    def fused_ref(self, ops):
        """This block as the C++ decode loop runs it (`ops.MoERef`, kernels/moe_decode_cpu.h:
        the same ops, equal to the bit), or None where the loop has no form of it: routing
        other than softmax top-k (DeepSeek's sigmoid, expert bias, groups, scaling), experts
        split over ranks or held dense (Triton, the reference loop), a tensor-parallel
        all-reduce, or a linear layer without a C++ reference."""
        r = self.router
        if (r.scoring != "softmax" or r.num_groups > 1 or r.scale != 1.0
                or self.expert_bias is not None or self.parallel is not None
                or self.experts.num_experts != r.num_experts or self.experts.grouped is None):
            return None
        router = self.gate.fused_ref(ops)
        gate_up, down = (g.fused_ref(ops) for g in self.experts.grouped)
        shared = None
        if self.shared_expert is not None:
            linears = [self.shared_expert.gate_up_proj.fused_ref(ops),
                       self.shared_expert.down_proj.fused_ref(ops)]
            gate = None
            if self.shared_expert_gate is not None:
                linears.append(gate := self.shared_expert_gate.fused_ref(ops))
            if any(ref is None for ref in linears):
                return None
            shared = ops.SharedExpertRef(linears[0], linears[1], gate)
        if router is None or gate_up is None or down is None:
            return None
        return ops.MoERef(router, gate_up, down, r.top_k, r.renormalize, shared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """On CPU in fp32 the C++ block (`fused_ref`, equal to `forward_torch` to the bit: one
        call instead of ~15 torch ops and module calls, ~20 us a layer at a decode step), else
        `forward_torch`."""
        if x.shape[0] and kernel_applies(x) and (block := self._cpu_block()) is not None:
            return block(x.contiguous())
        return self.forward_torch(x)

    def _cpu_block(self):
        """`fused_ref`, made at the first CPU call (after loading; made again if the router
        was replaced since, e.g. wrapped for LoRA), or None where there is none."""
        made = getattr(self, "_made_block", None)
        if made is None or made[0] is not self.gate:
            ops = cpu_ops.load()
            block = self.fused_ref(ops) if ops is not None and hasattr(ops, "MoERef") else None
            self._made_block = made = (self.gate, block)
        return made[1]

    def forward_torch(self, x: torch.Tensor) -> torch.Tensor:
        """The block in torch ops (and the grouped kernels): any device and dtype, autograd,
        expert and tensor parallelism, DeepSeek's routing."""
        weights, ids = select_experts(self.gate(x), self.router, self.expert_bias)
        out = run_experts(self.experts, x, weights, ids, self.router.num_experts)
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out if self.parallel is None else self.parallel(out)
