"""The `deepseek2` GGUF architecture (DeepSeek-V2, V2-Lite, V3): its config and tensor names
in HF terms.

Its `ArchSpec` entry is in :mod:`gguf_archs`. What llama.cpp's converter
(convert_hf_to_gguf.py, DeepseekV2Model) writes:

  * MLA as MQA: ``head_count_kv`` 1, ``key_length`` kv_lora_rank + rope, ``value_length``
    kv_lora_rank, the per-head sizes in ``key_length_mla`` / ``value_length_mla`` (older files:
    no ``*_mla`` keys, ``key_length`` / ``value_length`` are the per-head sizes);
  * kv_b_proj per head as ``attn_k_b`` [H, r, nope] (transposed) and ``attn_v_b`` [H, v, r]
    (older files: one ``attn_kv_b``); the model loads either (model/models/deepseek.py).
    Both are small and only used absorbed, so they load as float even from a quantized file
    (`DENSE_ONLY`), while every other matrix, the experts' included, stays in its blocks;
  * q/k rows unpermuted (llama.cpp rotates deepseek2 in interleaved pairs, as HF does);
  * the router's choice bias as ``exp_probs_b.bias``; the gating function 2 (sigmoid) marks
    V3 (noaux_tc: groups scored by their two best); softmax with groups is V2's
    group_limited_greedy (groups scored by their best), without groups plain top-k;
  * YaRN's ``yarn_log_multiplier`` is 0.1 x mscale_all_dim; llama.cpp takes mscale equal to
    it (as every DeepSeek config has), so the cos / sin factor is 1 and the softmax scale
    carries mscale^2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import DeepseekV2Config, DeepseekV3Config, PretrainedConfig

from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.gguf_arch import common_config

ARCH = "deepseek2"
MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID

# GGUF layer tensor name -> HF name (the experts' stacked names come from gguf_moe).
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "attn_k_b": "self_attn.k_b_proj",
    "attn_v_b": "self_attn.v_b_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
    "exp_probs_b": "mlp.gate.e_score_correction",
}
# HF names of the tensors loaded as float from any file (module docstring).
DENSE_ONLY = ("self_attn.kv_b_proj.weight", "self_attn.k_b_proj.weight",
              "self_attn.v_b_proj.weight")


def hf_name(name: str) -> str:
    """The HF name of a mapped tensor: ``...gate.e_score_correction.bias`` (from
    ``exp_probs_b.bias``) is HF's ``...gate.e_score_correction_bias``."""
    return name.replace("mlp.gate.e_score_correction.bias", "mlp.gate.e_score_correction_bias")


def config(meta: Callable[..., Any], tensor_shapes: dict[str, tuple[int, ...]]
           ) -> PretrainedConfig:
    """A ``DeepseekV3Config`` (sigmoid gating) or ``DeepseekV2Config`` from the
    ``deepseek2.*`` metadata (``meta(key, default)``) and the file's HF-order shapes."""
    base = common_config(ARCH, meta, tensor_shapes)
    a = ARCH
    heads = int(meta(f"{a}.attention.head_count"))
    rank = int(meta(f"{a}.attention.kv_lora_rank"))
    rope_dim = int(meta(f"{a}.rope.dimension_count"))
    if meta(f"{a}.attention.key_length_mla", None) is not None:
        qk_head = int(meta(f"{a}.attention.key_length_mla"))
        v_head = int(meta(f"{a}.attention.value_length_mla"))
    else:
        qk_head = int(meta(f"{a}.attention.key_length"))
        v_head = int(meta(f"{a}.attention.value_length"))
    rope: dict[str, Any] = {"rope_type": "default",
                            "rope_theta": float(meta(f"{a}.rope.freq_base", 10000.0))}
    scaling = meta(f"{a}.rope.scaling.type", "none")
    if scaling == "yarn":
        mscale = float(meta(f"{a}.rope.scaling.yarn_log_multiplier", 0.0)) / 0.1
        rope |= {"rope_type": "yarn", "factor": float(meta(f"{a}.rope.scaling.factor")),
                 "original_max_position_embeddings": int(
                     meta(f"{a}.rope.scaling.original_context_length")),
                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale": mscale, "mscale_all_dim": mscale}
    elif scaling != "none":
        raise UnsupportedModelError(f"GGUF deepseek2 rope scaling {scaling!r} is not supported")
    v3 = int(meta(f"{a}.expert_gating_func", 1)) == SIGMOID
    groups = int(meta(f"{a}.expert_group_count", 1) or 1)
    q_rank = int(meta(f"{a}.attention.q_lora_rank", 0) or 0)
    extra: dict[str, Any] = (
        {"norm_topk_prob": bool(meta(f"{a}.expert_weights_norm", False)), "rope_interleave": True}
        if v3 else {"topk_method": "group_limited_greedy" if groups > 1 else "greedy"})
    cls, hf_arch = ((DeepseekV3Config, "DeepseekV3ForCausalLM") if v3
                    else (DeepseekV2Config, "DeepseekV2ForCausalLM"))
    base["num_key_value_heads"] = heads  # the file says 1: MLA written as MQA (module doc)
    return cls(
        architectures=[hf_arch],
        moe_intermediate_size=int(meta(f"{a}.expert_feed_forward_length")),
        n_routed_experts=int(meta(f"{a}.expert_count")),
        num_experts_per_tok=int(meta(f"{a}.expert_used_count")),
        n_shared_experts=int(meta(f"{a}.expert_shared_count", 0)),
        routed_scaling_factor=float(meta(f"{a}.expert_weights_scale", 1.0)),
        first_k_dense_replace=int(meta(f"{a}.leading_dense_block_count", 0)),
        n_group=groups,
        topk_group=int(meta(f"{a}.expert_group_used_count", 1) or 1),
        q_lora_rank=q_rank or None,
        kv_lora_rank=rank,
        qk_rope_head_dim=rope_dim,
        qk_nope_head_dim=qk_head - rope_dim,
        v_head_dim=v_head,
        rope_parameters=rope,
        **base,
        **extra,
    )
