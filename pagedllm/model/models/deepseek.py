"""DeepSeek-V2 / V3: multi-head latent attention (model/layers/mla.py) with their MoE.

    layer i < first_k_dense_replace    MLA + dense SwiGLU MLP (intermediate_size)
    layer i >= first_k_dense_replace   MLA + FusedMoE: routed experts (V2 softmax, optionally
                                       group-limited; V3 sigmoid + e_score_correction_bias,
                                       grouped top-k, renormalized) x routed_scaling_factor,
                                       + the shared experts (one MLP, no gate)

The KV cache holds one latent row per token per layer (`MLAAttention`; kv_spec_for reads
`mla.latent_kv_dims`). q_lora_rank set (V3, V2): q = q_b(norm(q_a(x))); None (V2-Lite): q_proj.
HF names map as for the other MoE families, with `shared_experts` -> `shared_expert`,
`gate.e_score_correction_bias` -> `expert_bias` and `q_proj` -> `q_proj_full`; kv_b_proj
may also come split per head as llama.cpp writes it (`k_b_proj` [H, r, nope], `v_b_proj`
[H, v, r]; loader/gguf_deepseek2.py). Under tensor parallelism each rank holds its heads and
the whole latent (distributed/mla_sharding.py) and its share of the experts and of the shared
experts' width (distributed/expert_sharding.py; the rank's config says that width as
`shared_expert_intermediate_size`, which `moe_spec_for` reads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import torch

from pagedllm.errors import ModelLoadError
from pagedllm.model.layers.mla import MLAAttention
from pagedllm.model.layers.moe import MoESpec
from pagedllm.model.layers.quant import QuantizedWeight
from pagedllm.model.models.moe import MoEForCausalLM, MoEModel


class DeepseekModel(MoEModel):
    attention_cls = MLAAttention

    @staticmethod
    def moe_spec_for(config) -> MoESpec | None:
        """MoESpec's, with a tensor-parallel rank's shared-expert width where its config
        gives one (n_shared_experts x moe_intermediate_size is the whole width; under expert
        parallelism moe_intermediate_size stays whole while the shared experts split)."""
        spec = MoESpec.from_config(config)
        width = getattr(config, "shared_expert_intermediate_size", None)
        return spec if spec is None or width is None else dataclasses.replace(
            spec, shared_intermediate_size=width)


class DeepseekForCausalLM(MoEForCausalLM):
    """DeepSeek-V2 and V3 (module docstring); `DeepseekV2ForCausalLM` /
    `DeepseekV3ForCausalLM` in the registry."""

    model_cls = DeepseekModel
    renames = (
        (".shared_experts.", ".shared_expert."),
        (".mlp.gate.e_score_correction_bias", ".mlp.expert_bias"),
        (".self_attn.q_proj.", ".self_attn.q_proj_full."),
    )

    def __init__(self, config) -> None:
        if getattr(config, "mlp_bias", False):
            raise ModelLoadError(f"{config.model_type} with mlp_bias = true is not supported")
        super().__init__(config)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor | QuantizedWeight]]) -> None:
        super().load_weights(self._joined_kv_b(weights))

    @staticmethod
    def _joined_kv_b(weights: Iterable[tuple[str, torch.Tensor | QuantizedWeight]]
                     ) -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
        """The weights with each layer's `k_b_proj` / `v_b_proj` pair joined into HF's
        kv_b_proj [H (nope + v), r]; a layer with only one of them is a load error."""
        parts: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in weights:
            prefix, _, which = name.rpartition(".self_attn.")
            if which not in ("k_b_proj.weight", "v_b_proj.weight"):
                yield name, tensor
                continue
            if isinstance(tensor, QuantizedWeight):
                raise ModelLoadError(f"{name} must load as float (it is used absorbed)")
            pair = parts.setdefault(prefix, {})
            pair[which[0]] = tensor
            if len(pair) == 2:
                del parts[prefix]
                joined = torch.cat([pair["k"].transpose(1, 2), pair["v"]], 1)  # [H, nope+v, r]
                yield (f"{prefix}.self_attn.kv_b_proj.weight",
                       joined.reshape(-1, pair["v"].shape[-1]))
        if parts:
            raise ModelLoadError(f"checkpoint has only one of k_b_proj / v_b_proj in "
                                 f"{sorted(parts)[:4]}")
