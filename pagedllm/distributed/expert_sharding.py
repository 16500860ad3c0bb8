"""What each tensor-parallel rank holds of a mixture-of-experts layer's experts.

Two ways, chosen by `--enable-expert-parallel` (vLLM's flag name; by default EP when N
divides E: benchmarks/moe_parallel.py measured it faster, docs/distributed.md):

    tensor-parallel experts                  expert parallelism (EP)
    every rank holds every expert,           rank r holds experts [r*E/N, (r+1)*E/N) whole
    1/N of each one's width:                 (N must divide E); per-expert tensors of the
      gate / up: rows [r*I/N, (r+1)*I/N)     other ranks' experts are not loaded
      down: the same columns
    every token through every expert         each rank runs the assignments routed to its
    (on 1/N of the width)                    experts (tokens are replicated on every rank)

Either way each rank ends the layer with a partial sum of the routed experts' output, which
the MoE block adds to its shared expert's partial sum (split like a dense MLP) and completes
with one all-reduce (model/layers/moe/layer.py). The router is replicated.

Tensor names: per expert `....experts.{e}.(gate_proj|up_proj|down_proj|w1|w3|w2).weight` (HF
Hub checkpoints, Mixtral's w1 / w3 / w2, GGUF files split per expert), or stacked as
transformers 5 holds them (`....experts.gate_up_proj` [E, 2I, H], `....experts.down_proj`
[E, H, I]); the shared expert's `....shared_expert.(gate|up|down)_proj.weight` (DeepSeek's
`shared_experts`: its n_shared_experts as one MLP).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass

import numpy as np

from pagedllm.model.layers.moe import MoESpec

_PER_EXPERT = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|w1|w3|down_proj|w2)\.weight$")
_STACKED = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")
_SHARED = re.compile(r"\.shared_experts?\.(gate_proj|up_proj|down_proj)\.weight$")

# A cut: ("rows", index) / ("cols", (start, end)) as sharding.TPLayout's, ("drop", None): not
# held by this rank, ("take", (dim, index)): these positions of a stacked tensor's `dim`, or
# ("whole", None).
Cut = tuple[str, object]


@dataclass(frozen=True)
class ExpertSplit:
    """The experts of one MoE model over `world_size` ranks, seen from `rank`."""

    rank: int
    world_size: int
    num_experts: int
    expert_intermediate: int  # one routed expert's width
    shared_intermediate: int  # the shared expert's width (0: none)
    expert_parallel: bool

    def __post_init__(self) -> None:
        n = self.world_size
        if self.expert_parallel and self.num_experts % n:
            raise ValueError(f"expert parallelism: tensor_parallel_size {n} must divide the "
                             f"model's {self.num_experts} experts")
        if not self.expert_parallel and self.expert_intermediate % n:
            raise ValueError(f"tensor_parallel_size {n} must divide the experts' width "
                             f"(moe_intermediate_size {self.expert_intermediate}) when it "
                             "splits each expert; --enable-expert-parallel holds whole experts "
                             "per rank instead")
        if self.shared_intermediate % n:
            raise ValueError(f"tensor_parallel_size {n} must divide the shared expert's width "
                             f"{self.shared_intermediate}")

    @classmethod
    def for_model(cls, hf_config, rank: int, world_size: int,
                  expert_parallel: bool | None) -> ExpertSplit | None:
        """The split of a MoE model's experts (`expert_parallel` None: whole experts when
        `world_size` divides them, else by width); None for a dense model."""
        spec = MoESpec.from_config(hf_config)
        if spec is None:
            return None
        if expert_parallel is None:
            expert_parallel = spec.num_experts % world_size == 0
        return cls(rank, world_size, spec.num_experts, spec.intermediate_size,
                   spec.shared_intermediate_size, expert_parallel)

    def for_rank(self, rank: int) -> ExpertSplit:
        return dataclasses.replace(self, rank=rank)

    @property
    def expert_range(self) -> tuple[int, int]:
        """[first, end) of the experts this rank holds."""
        if not self.expert_parallel:
            return 0, self.num_experts
        per = self.num_experts // self.world_size
        return self.rank * per, (self.rank + 1) * per

    def model_config(self, cfg):
        """`cfg` (already a TP copy) with this rank's expert and shared-expert widths."""
        cfg = copy.copy(cfg)
        width = (self.expert_intermediate if self.expert_parallel
                 else self.expert_intermediate // self.world_size)
        if getattr(cfg, "moe_intermediate_size", None):  # Qwen: apart from the dense MLP's
            cfg.moe_intermediate_size = width
        else:  # Mixtral, OLMoE: intermediate_size is the experts' width
            cfg.intermediate_size = width
        if self.shared_intermediate:
            cfg.shared_expert_intermediate_size = self.shared_intermediate // self.world_size
        return cfg

    def cut(self, name: str) -> Cut | None:
        """This rank's part of an expert or shared-expert weight; None for other weights."""
        r, n = self.rank, self.world_size
        if hit := _SHARED.search(name):
            w = self.shared_intermediate // n
            if hit.group(1) == "down_proj":
                return "cols", (r * w, (r + 1) * w)
            return "rows", np.arange(r * w, (r + 1) * w)
        w = self.expert_intermediate // n
        first, end = self.expert_range
        if hit := _PER_EXPERT.search(name):
            if self.expert_parallel:
                return ("whole", None) if first <= int(hit.group(1)) < end else ("drop", None)
            if hit.group(2) in ("down_proj", "w2"):
                return "cols", (r * w, (r + 1) * w)
            return "rows", np.arange(r * w, (r + 1) * w)
        if hit := _STACKED.search(name):
            if self.expert_parallel:
                return "take", (0, np.arange(first, end))
            if hit.group(1) == "down_proj":
                return "take", (2, np.arange(r * w, (r + 1) * w))
            rows = np.arange(r * w, (r + 1) * w)
            return "take", (1, np.concatenate([rows, self.expert_intermediate + rows]))
        return None
