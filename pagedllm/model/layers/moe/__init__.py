"""Mixture-of-experts layers: router (router.py), stacked experts grouped by expert
(experts.py), the block that replaces an MLP (layer.py) and the families' shapes (spec.py)."""

from pagedllm.model.layers.moe.experts import StackedExperts, group_by_expert
from pagedllm.model.layers.moe.layer import FusedMoE, SharedExpert
from pagedllm.model.layers.moe.router import RouterSpec, select_experts
from pagedllm.model.layers.moe.spec import MOE_FAMILIES, MoESpec

__all__ = [
    "MOE_FAMILIES",
    "FusedMoE",
    "MoESpec",
    "RouterSpec",
    "SharedExpert",
    "StackedExperts",
    "group_by_expert",
    "select_experts",
]
