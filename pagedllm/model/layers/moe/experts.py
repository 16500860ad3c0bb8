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
    for each expert e with counts[e] > 0:      one GEMM pair per group of rows:
        xs[g] -> silu(gate) * up -> down       out[g] = down_e(act(gate_up_e(xs[g])))
    out *= weights.flat[order]
    y = zeros[T, H].index_add_(0, order // k, out)     the weighted combine

Rows are added in ascending expert order, the order HF's per-expert loop adds them.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.model.layers.activation import silu_and_mul

EXPERT_PARTS = ("gate", "up", "down")


def group_by_expert(ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, list[int]]:
    """(order [T*k]: assignments sorted by expert id, stable; tokens per expert [E])."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    return order, counts.tolist()


class StackedExperts(nn.Module):
    """E SwiGLU experts of hidden size H and width I (see the module doc)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.down_proj = nn.Parameter(
            torch.empty(num_experts, hidden_size, intermediate_size), requires_grad=False
        )

    @torch.no_grad()
    def load_expert(self, expert: int, part: str, tensor: torch.Tensor) -> None:
        """Copy one expert's HF weight ([I, H] for gate / up, [H, I] for down) into place."""
        if not 0 <= expert < self.num_experts:
            raise ValueError(f"expert {expert} is outside this layer's {self.num_experts} experts")
        inter = self.intermediate_size
        if part == "down":
            target = self.down_proj[expert]
        elif part in ("gate", "up"):
            start = 0 if part == "gate" else inter
            target = self.gate_up_proj[expert, start : start + inter]
        else:
            raise ValueError(f"expert weight part {part!r} is not one of {EXPERT_PARTS}")
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"expert {expert} {part} weight has shape {tuple(tensor.shape)}; "
                f"the layer expects {tuple(target.shape)}"
            )
        target.copy_(tensor)

    @property
    def expert_nbytes(self) -> int:
        """Bytes of one expert's weights."""
        return (self.gate_up_proj[0].numel() + self.down_proj[0].numel()) * (
            self.gate_up_proj.element_size()
        )

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """sum over each token's k experts of weight * expert(x): x [T, H], weights / ids
        [T, k] -> [T, H]."""
        k = ids.shape[1]
        order, counts = group_by_expert(ids, self.num_experts)
        tokens = order // k
        xs = x.index_select(0, tokens)
        out = torch.empty_like(xs)
        start = 0
        for expert, n in enumerate(counts):
            if n == 0:
                continue
            rows = slice(start, start + n)
            h = silu_and_mul(torch.mm(xs[rows], self.gate_up_proj[expert].t()))
            torch.mm(h, self.down_proj[expert].t(), out=out[rows])
            start += n
        out.mul_(weights.reshape(-1).index_select(0, order).unsqueeze(1).to(out.dtype))
        return torch.zeros_like(x).index_add_(0, tokens, out)
