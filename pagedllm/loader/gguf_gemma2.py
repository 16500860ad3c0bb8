"""The `gemma2` GGUF architecture: its config; names and value fix-ups are Gemma 3's
(:mod:`gguf_gemma3`: norms stored as ``1 + w``, q/k rows not permuted), without q/k norms.

llama.cpp's Gemma 2: sliding-window and full layers alternate, the first sliding
(``attention.sliding_window``); one RoPE base; attention and final logits soft-capped
(``attn_logit_softcapping``, ``final_logit_softcapping``); scores scaled by
``query_pre_attn_scalar^-0.5`` with the scalar hidden / heads for the 46-layer 27B model and
head_dim otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import Gemma2Config

from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.gguf_arch import common_config, head_dim

ARCH = "gemma2"


def config(meta: Callable[..., Any], tensor_shapes: dict[str, tuple[int, ...]]) -> Gemma2Config:
    """A ``Gemma2Config`` from the ``gemma2.*`` metadata (``meta(key, default)``) and the
    HF-order shapes of the file's tensors."""
    base = common_config(ARCH, meta, tensor_shapes)
    layers, heads = base["num_hidden_layers"], base["num_attention_heads"]
    if meta(f"{ARCH}.rope.scaling.type", "none") != "none":
        raise UnsupportedModelError("GGUF gemma2 rope scaling is not supported")
    dim = head_dim(ARCH, meta)
    return Gemma2Config(
        architectures=["Gemma2ForCausalLM"],
        head_dim=dim,
        sliding_window=int(meta(f"{ARCH}.attention.sliding_window")),
        layer_types=[
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
        ],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(meta(f"{ARCH}.rope.freq_base", 10000.0)),
        },
        query_pre_attn_scalar=base["hidden_size"] // heads if layers == 46 else dim,
        attn_logit_softcapping=meta(f"{ARCH}.attn_logit_softcapping", None),
        final_logit_softcapping=meta(f"{ARCH}.final_logit_softcapping", None),
        hidden_activation="gelu_pytorch_tanh",
        **base,
    )
