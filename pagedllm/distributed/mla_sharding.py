"""What each tensor-parallel rank holds of a multi-head latent attention block (DeepSeek-V2 /
V3, model/layers/mla.py), as vLLM splits it: the heads split across the ranks, the latent
(shared by every head) is replicated, so every rank caches the full latent row of each token
(its KV pool keeps one "head" of kv_lora_rank + qk_rope_head_dim values).

    weight                         rank r of N holds (heads [r*H/N, (r+1)*H/N))
    q_proj / q_b_proj              its heads' rows (nope + rope per head)
    q_a_proj, q_a_layernorm        whole (the q latent is shared by every head)
    kv_a_proj_with_mqa, its norm   whole (the KV latent: every rank computes and caches it)
    kv_b_proj [H (nope+v), r]      its heads' rows
    k_b_proj [H, r, nope] /        its heads (dim 0; GGUF files split kv_b_proj per head)
    v_b_proj [H, v, r]
    o_proj                         its heads' columns (v per head; row-parallel, all-reduced;
                                   a bias is added by rank 0)

N must divide the heads (the heads are independent: no KV groups to keep whole).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from pagedllm.model.layers.mla import MLA_FAMILIES

# A cut as sharding.TPLayout's: ("rows", index), ("cols", (start, end)), ("bias0", None),
# ("take", (dim, index)).
Cut = tuple[str, object]


@dataclass(frozen=True)
class MLASplit:
    """The heads of one MLA model over `world_size` ranks, seen from `rank`."""

    rank: int
    world_size: int
    num_heads: int
    qk_head_dim: int  # qk_nope_head_dim + qk_rope_head_dim: q rows per head
    kv_b_head_dim: int  # qk_nope_head_dim + v_head_dim: kv_b_proj rows per head
    v_head_dim: int  # o_proj columns per head

    def __post_init__(self) -> None:
        if self.num_heads % self.world_size:
            raise ValueError(f"multi-head latent attention splits its heads across the ranks: "
                             f"tensor_parallel_size {self.world_size} must divide the model's "
                             f"{self.num_heads} attention heads")

    @classmethod
    def for_model(cls, hf_config, rank: int, world_size: int) -> MLASplit | None:
        """The split of an MLA config's attention heads; None for other families."""
        if getattr(hf_config, "model_type", None) not in MLA_FAMILIES:
            return None
        nope = hf_config.qk_nope_head_dim
        return cls(rank, world_size, hf_config.num_attention_heads,
                   nope + hf_config.qk_rope_head_dim, nope + hf_config.v_head_dim,
                   hf_config.v_head_dim)

    def for_rank(self, rank: int) -> MLASplit:
        return dataclasses.replace(self, rank=rank)

    @property
    def head_range(self) -> tuple[int, int]:
        per = self.num_heads // self.world_size
        return self.rank * per, (self.rank + 1) * per

    def cut(self, name: str) -> Cut | None:
        """This rank's part of an attention weight (HF names); None for other weights
        (replicated ones included: the generic rules hold them whole)."""
        if ".self_attn." not in name:
            return None
        first, end = self.head_range
        if ".q_proj." in name or ".q_b_proj." in name:
            return "rows", np.arange(first * self.qk_head_dim, end * self.qk_head_dim)
        if ".kv_b_proj." in name:
            return "rows", np.arange(first * self.kv_b_head_dim, end * self.kv_b_head_dim)
        if ".k_b_proj." in name or ".v_b_proj." in name:
            return "take", (0, np.arange(first, end))
        if ".o_proj." in name:
            if name.endswith(".bias"):
                return "bias0", None
            return "cols", (first * self.v_head_dim, end * self.v_head_dim)
        return None
