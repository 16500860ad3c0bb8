"""DeepSeek-V2 / V3: multi-head latent attention (model/layers/mla.py) with their MoE.

    layer i < first_k_dense_replace    MLA + dense SwiGLU MLP (intermediate_size)
    layer i >= first_k_dense_replace   MLA + FusedMoE: routed experts (V2 softmax, optionally
                                       group-limited; V3 sigmoid + e_score_correction_bias,
                                       grouped top-k, renormalized) x routed_scaling_factor,
                                       + the shared experts (one MLP, no gate)

The KV cache holds one latent row per token per layer (`MLAAttention`; kv_spec_for reads
`mla.latent_kv_dims`). q_lora_rank set (V3, V2): q = q_b(norm(q_a(x))); None (V2-Lite): q_proj.
HF names map as for the other MoE families, with `shared_experts` -> `shared_expert`,
`gate.e_score_correction_bias` -> `expert_bias` and `q_proj` -> `q_proj_full`. Tensor
parallelism is refused: the latent cache and kv_b_proj are not sharded.
"""

from __future__ import annotations

from pagedllm.errors import ModelLoadError
from pagedllm.model.layers.mla import MLAAttention
from pagedllm.model.layers.parallel import output_collective
from pagedllm.model.models.moe import MoEForCausalLM, MoEModel


class DeepseekModel(MoEModel):
    attention_cls = MLAAttention


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
        if output_collective("sum") is not None:
            raise ModelLoadError(
                f"{config.model_type} (multi-head latent attention) does not support tensor "
                "parallelism; run it with tensor_parallel_size 1")
        if getattr(config, "mlp_bias", False):
            raise ModelLoadError(f"{config.model_type} with mlp_bias = true is not supported")
        super().__init__(config)
