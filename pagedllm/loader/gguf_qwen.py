"""The `qwen2`, `qwen3`, `qwen2moe` and `qwen3moe` GGUF architectures: their config and
tensor names in HF terms.

Dispatched to from :mod:`gguf_loader` on ``general.architecture``. What differs from llama's
GGUF files:

  * q/k rows are not permuted (Qwen uses NEOX-style RoPE): no reverse permutation;
  * qwen2 has q/k/v biases (``attn_q.bias``, ...); qwen3 has per-head q/k RMSNorms
    (``attn_q_norm``, ``attn_k_norm``) and a head size of its own (``attention.key_length``);
  * metadata keys are ``<arch>.*`` with llama's meanings, plus the experts' for the MoE
    files (``expert_count``, ``expert_used_count``, ``expert_feed_forward_length``,
    ``expert_shared_feed_forward_length``);
  * MoE experts are stacked per layer (``ffn_gate_exps`` [E, I, H], ...): gguf_loader splits
    them into HF's per-expert tensors (:mod:`gguf_moe`); the router is ``ffn_gate_inp``, the
    shared expert ``*_shexp`` with its gate ``ffn_gate_inp_shexp`` (one row);
  * llama.cpp always renormalizes qwen3moe's top-k weights and never qwen2moe's (HF's
    `norm_topk_prob`, which the files do not carry).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import (
    PretrainedConfig,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3Config,
    Qwen3MoeConfig,
)

from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.gguf_arch import LLAMA_LAYER_NAMES, QK_NORM_NAMES, common_config, head_dim

ARCHES = ("qwen2", "qwen3", "qwen2moe", "qwen3moe")
MODEL_TYPES = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")  # their HF configs' model_type
_CONFIGS = {  # arch -> (config class, HF architecture)
    "qwen2": (Qwen2Config, "Qwen2ForCausalLM"),
    "qwen3": (Qwen3Config, "Qwen3ForCausalLM"),
    "qwen2moe": (Qwen2MoeConfig, "Qwen2MoeForCausalLM"),
    "qwen3moe": (Qwen3MoeConfig, "Qwen3MoeForCausalLM"),
}

# GGUF layer tensor name -> HF name (the global names are llama's).
LAYER_NAMES = {
    **LLAMA_LAYER_NAMES,
    **QK_NORM_NAMES,
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}


def config(
    arch: str, meta: Callable[..., Any], tensor_shapes: dict[str, tuple[int, ...]]
) -> PretrainedConfig:
    """A ``Qwen2Config`` / ``Qwen3Config`` from the ``<arch>.*`` metadata (``meta(key,
    default)``) and the HF-order shapes of the file's tensors."""
    base = common_config(arch, meta, tensor_shapes)
    scaling = meta(f"{arch}.rope.scaling.type", "none")
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(meta(f"{arch}.rope.freq_base", 1e6)),
    }
    if scaling == "yarn":
        rope = {
            **rope,
            "rope_type": "yarn",
            "factor": float(meta(f"{arch}.rope.scaling.factor")),
            "original_max_position_embeddings": int(
                meta(f"{arch}.rope.scaling.original_context_length")
            ),
        }
    elif scaling != "none":
        raise UnsupportedModelError(f"GGUF {arch} rope scaling {scaling!r} is not supported")
    cls, hf_arch = _CONFIGS[arch]
    extra: dict[str, Any] = {}
    if arch in ("qwen3", "qwen3moe"):
        extra = {
            "head_dim": head_dim(arch, meta),
            "attention_bias": "blk.0.attn_q.bias" in tensor_shapes,
        }
    elif arch == "qwen2moe":
        extra = {"qkv_bias": "blk.0.attn_q.bias" in tensor_shapes}
    if arch.endswith("moe"):
        extra |= {
            "num_experts": int(meta(f"{arch}.expert_count")),
            "num_experts_per_tok": int(meta(f"{arch}.expert_used_count")),
            "moe_intermediate_size": int(meta(f"{arch}.expert_feed_forward_length")),
            "norm_topk_prob": arch == "qwen3moe",
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
    if arch == "qwen2moe":
        extra["shared_expert_intermediate_size"] = int(
            meta(f"{arch}.expert_shared_feed_forward_length")
        )
    return cls(architectures=[hf_arch], rope_parameters=rope, **base, **extra)
