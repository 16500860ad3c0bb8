"""The `glm4` GGUF architecture (GLM-4-0414): its config, tensor names and q/k row order.

What llama.cpp's converter writes for GLM-4 (``Glm4Model``):
  * sandwich norms: ``attn_norm`` (HF ``input_layernorm``), ``post_attention_norm``
    (``post_self_attn_layernorm``), ``ffn_norm`` (``post_attention_layernorm``),
    ``post_ffw_norm`` (``post_mlp_layernorm``);
  * HF's fused ``mlp.gate_up_proj`` as ``ffn_up`` (2 x intermediate rows: gate, then up);
  * q/k/v biases; partial RoPE on ``rope.dimension_count`` = head_dim * partial_rotary_factor
    features, interleaved pairs (llama.cpp's "normal" RoPE, GLM's own): rows unpermuted.

pagedllm's GLM-4 runs rotate-half kernels on rows reordered at load (`glm4.half_rotation_
order`). A quantized matrix cannot be reordered once built, so this loader reorders q/k rows
itself, while building (`row_order`), and marks the config (`glm4.QK_ROWS_HALVED`) so the
model does not reorder them again.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from transformers import Glm4Config, PretrainedConfig

from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.gguf_arch import LLAMA_LAYER_NAMES, Meta, Shapes, common_config, head_dim
from pagedllm.model.layers.rope_scaling import rotary_dim
from pagedllm.model.models.glm4 import QK_ROWS_HALVED, half_rotation_order

ARCH = "glm4"
LAYER_NAMES = {
    **LLAMA_LAYER_NAMES,
    "post_attention_norm": "post_self_attn_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_mlp_layernorm",
    "ffn_up": "mlp.gate_up_proj",
}
ROPE_FREQS = "rope_freqs.weight"


def config(meta: Meta, shapes: Shapes) -> Glm4Config:
    """A ``Glm4Config`` from the ``glm4.*`` metadata and the file's HF-order shapes."""
    if ROPE_FREQS in shapes:
        raise UnsupportedModelError("GGUF glm4 file with rope_freqs (per-frequency RoPE "
                                    "factors) is not supported")
    base = common_config(ARCH, meta, shapes)
    dim = head_dim(ARCH, meta)
    rotary = int(meta(f"{ARCH}.rope.dimension_count", dim // 2))
    if not 0 < rotary <= dim or rotary % 2:
        raise UnsupportedModelError(f"GGUF glm4 rope.dimension_count {rotary} must be even and "
                                    f"in (0, head size {dim}]")
    rope: dict[str, Any] = {"rope_type": "default", "partial_rotary_factor": rotary / dim,
                            "rope_theta": float(meta(f"{ARCH}.rope.freq_base", 10000.0))}
    if (scaling := meta(f"{ARCH}.rope.scaling.type", "none")) != "none":
        raise UnsupportedModelError(f"GGUF glm4 rope scaling {scaling!r} is not supported")
    config = Glm4Config(architectures=["Glm4ForCausalLM"], head_dim=dim, rope_parameters=rope,
                        attention_bias="blk.0.attn_q.bias" in shapes, **base)
    setattr(config, QK_ROWS_HALVED, True)
    return config


def row_order(hf_name: str, rows: int, config: PretrainedConfig) -> np.ndarray | None:
    """q/k rows (weight and bias) of every head in rotate-half order; others unchanged."""
    if ".self_attn.q_proj." not in hf_name and ".self_attn.k_proj." not in hf_name:
        return None
    dim = config.head_dim
    per_head = half_rotation_order(dim, rotary_dim(dim, config.rope_parameters)).numpy()
    return (np.arange(rows // dim)[:, None] * dim + per_head[None, :]).reshape(-1)
