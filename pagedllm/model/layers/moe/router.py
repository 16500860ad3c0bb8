"""Expert selection of a mixture-of-experts layer: router logits -> (weights, expert ids).

    scores  = softmax(logits) | sigmoid(logits)                [T, E], fp32
    choice  = scores + expert_bias                             the bias only steers the choice
    grouped (num_groups > 1): experts form G equal groups; a group's score is the sum of its
              two best `choice` values (`group_score="top2"`, V3's noaux_tc) or its best one
              ("max", V2's group_limited_greedy); all but the `topk_groups` best groups are
              masked out
    ids     = topk(choice, top_k)                              [T, k]
    weights = scores[ids]  (/ their sum if renormalize)  * scale

Mixtral: softmax, always renormalized. Qwen2-MoE, Qwen3-MoE, OLMoE: softmax, renormalized
when `norm_topk_prob`. DeepSeek-V3: sigmoid, expert bias (`e_score_correction_bias`), grouped
top-k, renormalized, `routed_scaling_factor`. DeepSeek-V2: softmax, grouped by each group's
best score when `topk_method` is group_limited_greedy, `routed_scaling_factor`. Ties go to the lower expert id (torch.topk), as
HF transformers picks them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCORINGS = ("softmax", "sigmoid")
GROUP_SCORES = ("top2", "max")


@dataclass(frozen=True)
class RouterSpec:
    """How one family routes; validated at construction."""

    num_experts: int
    top_k: int
    scoring: str = "softmax"
    renormalize: bool = False
    num_groups: int = 1
    topk_groups: int = 1
    scale: float = 1.0
    group_score: str = "top2"

    def __post_init__(self) -> None:
        if self.num_experts < 1:
            raise ValueError(f"a MoE layer needs at least one expert; got {self.num_experts}")
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(
                f"experts per token (top_k) must be in [1, {self.num_experts}] "
                f"(the number of experts); got {self.top_k}"
            )
        if self.scoring not in SCORINGS:
            raise ValueError(f"router scoring {self.scoring!r} is not one of {SCORINGS}")
        if self.group_score not in GROUP_SCORES:
            raise ValueError(
                f"expert group score {self.group_score!r} is not one of {GROUP_SCORES}"
            )
        if self.num_experts % self.num_groups:
            raise ValueError(
                f"{self.num_groups} expert groups do not divide {self.num_experts} experts"
            )
        if not 1 <= self.topk_groups <= self.num_groups:
            raise ValueError(
                f"topk_groups must be in [1, {self.num_groups}] (the number of "
                f"groups); got {self.topk_groups}"
            )
        per_group = self.num_experts // self.num_groups
        if self.num_groups > 1 and self.topk_groups * per_group < self.top_k:
            raise ValueError(
                f"{self.topk_groups} groups of {per_group} experts hold fewer "
                f"than top_k = {self.top_k} experts"
            )


def select_experts(
    logits: torch.Tensor, spec: RouterSpec, expert_bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] fp32, expert ids [T, k] int64) for router logits [T, E]."""
    logits = logits.float()
    scores = logits.softmax(-1) if spec.scoring == "softmax" else logits.sigmoid()
    choice = scores if expert_bias is None else scores + expert_bias.float()
    if spec.num_groups > 1:
        choice = _mask_groups(choice, spec)
    if expert_bias is None and spec.num_groups == 1:
        weights, ids = torch.topk(scores, spec.top_k, dim=-1)
    else:
        ids = torch.topk(choice, spec.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
    if spec.renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    if spec.scale != 1.0:
        weights = weights * spec.scale
    return weights, ids


def _mask_groups(choice: torch.Tensor, spec: RouterSpec) -> torch.Tensor:
    """`choice` with the experts of all but each token's `topk_groups` best groups at -inf."""
    t = choice.shape[0]
    grouped = choice.view(t, spec.num_groups, -1)
    best = 1 if spec.group_score == "max" else min(2, grouped.shape[-1])
    group_scores = grouped.topk(best, dim=-1).values.sum(-1)  # [T, G]
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, group_scores.topk(spec.topk_groups, dim=-1).indices, True)
    return grouped.masked_fill(~keep.unsqueeze(-1), float("-inf")).view(t, -1)
