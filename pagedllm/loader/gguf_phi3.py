"""The `phi3` GGUF architecture (Phi-3, Phi-3.5, Phi-4): its config and tensor names.

llama.cpp keeps Phi-3's fused tensors: ``attn_qkv`` is HF's ``qkv_proj`` and ``ffn_up`` its
``gate_up_proj`` (gate rows, then up rows); q/k rows are not permuted (NEOX RoPE). LongRoPE
lives in two tensors, ``rope_factors_short`` / ``rope_factors_long`` (read into the config's
`rope_parameters`, not loaded as weights), with ``rope.scaling.original_context_length`` and
``rope.scaling.attn_factor``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import Phi3Config

from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.gguf_arch import common_config

ARCH = "phi3"
LAYER_NAMES = {
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_up": "mlp.gate_up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
ROPE_FACTORS = ("rope_factors_short.weight", "rope_factors_long.weight")


def config(
    meta: Callable[..., Any],
    tensor_shapes: dict[str, tuple[int, ...]],
    rope_factors: dict[str, list[float]],
) -> Phi3Config:
    """A ``Phi3Config`` from the ``phi3.*`` metadata (``meta(key, default)``), the HF-order
    shapes of the file's tensors and its LongRoPE factor tensors (name -> values)."""
    base = common_config(ARCH, meta, tensor_shapes)
    head_dim = base["hidden_size"] // base["num_attention_heads"]
    rotary = int(meta(f"{ARCH}.rope.dimension_count", head_dim))
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": float(meta(f"{ARCH}.rope.freq_base", 10000.0)),
    }
    extra: dict[str, Any] = {}
    if rope_factors:
        if set(rope_factors) != set(ROPE_FACTORS):
            raise UnsupportedModelError(
                f"GGUF phi3 file has {sorted(rope_factors)}; LongRoPE needs both of {ROPE_FACTORS}"
            )
        rope |= {
            "rope_type": "longrope",
            "short_factor": rope_factors["rope_factors_short.weight"],
            "long_factor": rope_factors["rope_factors_long.weight"],
        }
        if (attn := meta(f"{ARCH}.rope.scaling.attn_factor", None)) is not None:
            rope["attention_factor"] = float(attn)
        extra["original_max_position_embeddings"] = int(
            meta(f"{ARCH}.rope.scaling.original_context_length")
        )
    if rotary != head_dim:
        rope["partial_rotary_factor"] = rotary / head_dim
    return Phi3Config(
        architectures=["Phi3ForCausalLM"],
        rope_parameters=rope,
        sliding_window=meta(f"{ARCH}.attention.sliding_window", None),
        **base,
        **extra,
    )
