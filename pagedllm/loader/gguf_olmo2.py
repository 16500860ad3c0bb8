"""The `olmo2` GGUF architecture (OLMo 2): its config and tensor names in HF terms.

What llama.cpp's converter writes for OLMo 2 (``Olmo2Model``):
  * no pre-norms: each layer has ``post_attention_norm`` and ``post_ffw_norm`` only (HF's
    ``post_attention_layernorm`` / ``post_feedforward_layernorm``);
  * q/k RMSNorms over all heads together (``attn_q_norm`` [H * d], ``attn_k_norm``
    [KVH * d]), HF's ``self_attn.q_norm`` / ``k_norm``;
  * q/k rows not permuted (llama.cpp runs OLMo 2 with NEOX RoPE, HF's rotate-half).
"""

from __future__ import annotations

from typing import Any

from transformers import Olmo2Config

from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.gguf_arch import LLAMA_LAYER_NAMES, QK_NORM_NAMES, Meta, Shapes, common_config

ARCH = "olmo2"
LAYER_NAMES = {
    **{k: v for k, v in LLAMA_LAYER_NAMES.items() if k not in ("attn_norm", "ffn_norm")},
    **QK_NORM_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def config(meta: Meta, shapes: Shapes) -> Olmo2Config:
    """An ``Olmo2Config`` from the ``olmo2.*`` metadata and the file's HF-order shapes."""
    base = common_config(ARCH, meta, shapes)
    head_dim = base["hidden_size"] // base["num_attention_heads"]
    if int(meta(f"{ARCH}.attention.key_length", head_dim)) != head_dim:
        raise UnsupportedModelError(f"GGUF olmo2 head size {meta(f'{ARCH}.attention.key_length')}"
                                    f" is not hidden / heads = {head_dim} (HF OLMo 2's)")
    rope: dict[str, Any] = {"rope_type": "default",
                            "rope_theta": float(meta(f"{ARCH}.rope.freq_base", 10000.0))}
    if (scaling := meta(f"{ARCH}.rope.scaling.type", "none")) != "none":
        raise UnsupportedModelError(f"GGUF olmo2 rope scaling {scaling!r} is not supported")
    return Olmo2Config(architectures=["Olmo2ForCausalLM"], rope_parameters=rope,
                       attention_bias="blk.0.attn_q.bias" in shapes, **base)
