"""The `gemma3` GGUF architecture: its config and tensor names in HF terms.

Kept apart from the llama path of :mod:`gguf_loader`, which dispatches here on
``general.architecture == "gemma3"``. What llama.cpp's converter does differently for Gemma 3,
and how it is undone:

  * every ``*norm.weight`` is stored as ``1 + w`` (Gemma's RMSNorm multiplies by ``1 + w``;
    llama.cpp by the stored weight): 1 is subtracted back;
  * q/k rows are not permuted (Gemma uses NEOX-style RoPE): no reverse permutation;
  * settings llama.cpp hard-codes are filled in the same way: every 6th layer is full
    attention (the rest use ``attention.sliding_window``), sliding layers use RoPE base 10k,
    ``query_pre_attn_scalar`` is head_dim (hidden / heads for the 62-layer 27B model).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from transformers import Gemma3TextConfig

from pagedllm.loader.errors import UnsupportedModelError

ARCH = "gemma3"
SLIDING_PATTERN = 6
LOCAL_ROPE_BASE = 10000.0

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
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def to_hf(name: str, array: np.ndarray) -> np.ndarray:
    """The HF value of a dequantized tensor: norm weights lose llama.cpp's +1."""
    if name.endswith("norm.weight"):
        return array.astype(np.float32) - 1.0
    return array


def config(meta: Callable[..., Any], tensor_shapes: dict[str, tuple[int, ...]]
           ) -> Gemma3TextConfig:
    """A ``Gemma3TextConfig`` from the ``gemma3.*`` metadata (``meta(key, default)``) and
    the HF-order shapes of the file's tensors."""
    if "token_embd.weight" not in tensor_shapes:
        raise UnsupportedModelError("GGUF file has no token_embd.weight tensor")
    layers = int(meta(f"{ARCH}.block_count"))
    heads = int(meta(f"{ARCH}.attention.head_count"))
    hidden = int(meta(f"{ARCH}.embedding_length"))
    head_dim = int(meta(f"{ARCH}.attention.key_length", hidden // heads))
    pattern = int(meta(f"{ARCH}.attention.sliding_window_pattern", SLIDING_PATTERN))
    full_rope: dict[str, Any] = {"rope_type": "default",
                                 "rope_theta": float(meta(f"{ARCH}.rope.freq_base", 1e6))}
    scaling = meta(f"{ARCH}.rope.scaling.type", "none")
    if scaling == "linear":
        full_rope = {**full_rope, "rope_type": "linear",
                     "factor": float(meta(f"{ARCH}.rope.scaling.factor"))}
    elif scaling != "none":
        raise UnsupportedModelError(f"GGUF gemma3 rope scaling {scaling!r} is not supported")
    return Gemma3TextConfig(
        architectures=["Gemma3ForCausalLM"],
        vocab_size=tensor_shapes["token_embd.weight"][0],
        hidden_size=hidden,
        intermediate_size=int(meta(f"{ARCH}.feed_forward_length")),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=int(meta(f"{ARCH}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        max_position_embeddings=int(meta(f"{ARCH}.context_length")),
        rms_norm_eps=float(meta(f"{ARCH}.attention.layer_norm_rms_epsilon")),
        sliding_window=int(meta(f"{ARCH}.attention.sliding_window")),
        layer_types=["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                     for i in range(layers)],
        rope_parameters={"full_attention": full_rope,
                         "sliding_attention": {"rope_type": "default",
                                               "rope_theta": LOCAL_ROPE_BASE}},
        query_pre_attn_scalar=hidden // heads if layers == 62 else head_dim,
        final_logit_softcapping=meta(f"{ARCH}.final_logit_softcapping", None),
        attn_logit_softcapping=meta(f"{ARCH}.attn_logit_softcapping", None),
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings="output.weight" not in tensor_shapes,
        bos_token_id=meta("tokenizer.ggml.bos_token_id", None),
        eos_token_id=meta("tokenizer.ggml.eos_token_id", None),
        pad_token_id=meta("tokenizer.ggml.padding_token_id", None),
    )
