"""The `gemma3` GGUF architecture: its config and tensor names in HF terms.

Its `ArchSpec` is in :mod:`gguf_archs`. What llama.cpp's converter does differently for Gemma 3,
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

from transformers import Gemma3TextConfig

from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.gguf_arch import LLAMA_LAYER_NAMES, QK_NORM_NAMES, common_config, head_dim

ARCH = "gemma3"
SLIDING_PATTERN = 6
LOCAL_ROPE_BASE = 10000.0

# GGUF layer tensor name -> HF name (the global names are llama's; gemma2 uses them too).
LAYER_NAMES = {
    **LLAMA_LAYER_NAMES,
    **QK_NORM_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
NORM_OFFSET = 1.0  # llama.cpp stores Gemma's RMSNorm weights as 1 + w


def config(meta: Callable[..., Any], tensor_shapes: dict[str, tuple[int, ...]]
           ) -> Gemma3TextConfig:
    """A ``Gemma3TextConfig`` from the ``gemma3.*`` metadata (``meta(key, default)``) and
    the HF-order shapes of the file's tensors."""
    base = common_config(ARCH, meta, tensor_shapes)
    layers, heads = base["num_hidden_layers"], base["num_attention_heads"]
    pattern = int(meta(f"{ARCH}.attention.sliding_window_pattern", SLIDING_PATTERN))
    full_rope: dict[str, Any] = {"rope_type": "default",
                                 "rope_theta": float(meta(f"{ARCH}.rope.freq_base", 1e6))}
    scaling = meta(f"{ARCH}.rope.scaling.type", "none")
    if scaling == "linear":
        full_rope = {**full_rope, "rope_type": "linear",
                     "factor": float(meta(f"{ARCH}.rope.scaling.factor"))}
    elif scaling != "none":
        raise UnsupportedModelError(f"GGUF gemma3 rope scaling {scaling!r} is not supported")
    dim = head_dim(ARCH, meta)
    return Gemma3TextConfig(
        architectures=["Gemma3ForCausalLM"],
        head_dim=dim,
        sliding_window=int(meta(f"{ARCH}.attention.sliding_window")),
        layer_types=["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                     for i in range(layers)],
        rope_parameters={"full_attention": full_rope,
                         "sliding_attention": {"rope_type": "default",
                                               "rope_theta": LOCAL_ROPE_BASE}},
        query_pre_attn_scalar=base["hidden_size"] // heads if layers == 62 else dim,
        final_logit_softcapping=meta(f"{ARCH}.final_logit_softcapping", None),
        attn_logit_softcapping=meta(f"{ARCH}.attn_logit_softcapping", None),
        hidden_activation="gelu_pytorch_tanh",
        **base,
    )
