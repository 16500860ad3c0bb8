"""The `llama` GGUF architecture (Llama, Mistral, SmolLM; Mixtral when the file has
experts, :mod:`gguf_moe`): its config from the ``llama.*`` metadata.

llama.cpp permutes llama's q/k rows for its interleaved RoPE (undone by
`gguf_arch.llama_row_order`) and writes Llama 3.1+'s RoPE scaling as one divisor per
frequency, the ``rope_freqs`` tensor (read into the config's `rope_freq_factors`).
"""

from __future__ import annotations

import logging

from transformers import LlamaConfig, PretrainedConfig

from pagedllm.loader import gguf_moe
from pagedllm.loader.gguf_arch import Meta, Shapes, Vectors, common_config, head_dim

logger = logging.getLogger(__name__)

ARCH = "llama"
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's per-frequency RoPE divisors (Llama 3.1+)


def config(meta: Meta, shapes: Shapes, vectors: Vectors) -> PretrainedConfig:
    """A ``LlamaConfig`` (``MixtralConfig`` for an MoE file) from the file's metadata, its
    HF-order tensor shapes and its ``rope_freqs`` values (`vectors`)."""
    if gguf_moe.is_llama_moe(meta):
        return gguf_moe.mixtral_config(meta, shapes)
    base = common_config(ARCH, meta, shapes)
    scaling = meta(f"{ARCH}.rope.scaling.type", "none")
    if scaling != "none":
        logger.warning("GGUF rope scaling '%s' is ignored (plain RoPE is used)", scaling)
    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        head_dim=head_dim(ARCH, meta),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(meta(f"{ARCH}.rope.freq_base", 10000.0)),
        },
        attention_bias="blk.0.attn_q.bias" in shapes,
        # Llama 3.1+: the llama3 RoPE scaling as one divisor per frequency (rope_scaling.py)
        rope_freq_factors=vectors(ROPE_FREQS) if ROPE_FREQS in shapes else None,
        **base,
    )
