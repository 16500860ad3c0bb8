"""The `qwen2` and `qwen3` GGUF architectures: their config and tensor names in HF terms.

Dispatched to from :mod:`gguf_loader` on ``general.architecture``. What differs from llama's
GGUF files:

  * q/k rows are not permuted (Qwen uses NEOX-style RoPE): no reverse permutation;
  * qwen2 has q/k/v biases (``attn_q.bias``, ...); qwen3 has per-head q/k RMSNorms
    (``attn_q_norm``, ``attn_k_norm``) and a head size of its own (``attention.key_length``);
  * metadata keys are ``qwen2.*`` / ``qwen3.*`` with llama's meanings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import PretrainedConfig, Qwen2Config, Qwen3Config

from pagedllm.loader.errors import UnsupportedModelError

ARCHES = ("qwen2", "qwen3")

# GGUF layer tensor name -> HF name (gguf_loader.hf_tensor_name maps with it; the global
# names are llama's).
LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def config(
    arch: str, meta: Callable[..., Any], tensor_shapes: dict[str, tuple[int, ...]]
) -> PretrainedConfig:
    """A ``Qwen2Config`` / ``Qwen3Config`` from the ``<arch>.*`` metadata (``meta(key,
    default)``) and the HF-order shapes of the file's tensors."""
    if "token_embd.weight" not in tensor_shapes:
        raise UnsupportedModelError("GGUF file has no token_embd.weight tensor")
    heads = int(meta(f"{arch}.attention.head_count"))
    hidden = int(meta(f"{arch}.embedding_length"))
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
    cls, extra = (
        (Qwen2Config, {})
        if arch == "qwen2"
        else (
            Qwen3Config,
            {
                "head_dim": int(meta(f"{arch}.attention.key_length", hidden // heads)),
                "attention_bias": "blk.0.attn_q.bias" in tensor_shapes,
            },
        )
    )
    return cls(
        architectures=["Qwen2ForCausalLM" if arch == "qwen2" else "Qwen3ForCausalLM"],
        vocab_size=tensor_shapes["token_embd.weight"][0],
        hidden_size=hidden,
        intermediate_size=int(meta(f"{arch}.feed_forward_length")),
        num_hidden_layers=int(meta(f"{arch}.block_count")),
        num_attention_heads=heads,
        num_key_value_heads=int(meta(f"{arch}.attention.head_count_kv", heads)),
        max_position_embeddings=int(meta(f"{arch}.context_length")),
        rms_norm_eps=float(meta(f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_parameters=rope,
        tie_word_embeddings="output.weight" not in tensor_shapes,
        bos_token_id=meta("tokenizer.ggml.bos_token_id", None),
        eos_token_id=meta("tokenizer.ggml.eos_token_id", None),
        pad_token_id=meta("tokenizer.ggml.padding_token_id", None),
        **extra,
    )
