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

ARCH = "gemma2"


def config(meta: Callable[..., Any], tensor_shapes: dict[str, tuple[int, ...]]) -> Gemma2Config:
    """A ``Gemma2Config`` from the ``gemma2.*`` metadata (``meta(key, default)``) and the
    HF-order shapes of the file's tensors."""
    if "token_embd.weight" not in tensor_shapes:
        raise UnsupportedModelError("GGUF file has no token_embd.weight tensor")
    layers = int(meta(f"{ARCH}.block_count"))
    heads = int(meta(f"{ARCH}.attention.head_count"))
    hidden = int(meta(f"{ARCH}.embedding_length"))
    head_dim = int(meta(f"{ARCH}.attention.key_length", hidden // heads))
    if meta(f"{ARCH}.rope.scaling.type", "none") != "none":
        raise UnsupportedModelError("GGUF gemma2 rope scaling is not supported")
    return Gemma2Config(
        architectures=["Gemma2ForCausalLM"],
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
        layer_types=[
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)
        ],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(meta(f"{ARCH}.rope.freq_base", 10000.0)),
        },
        query_pre_attn_scalar=hidden // heads if layers == 46 else head_dim,
        attn_logit_softcapping=meta(f"{ARCH}.attn_logit_softcapping", None),
        final_logit_softcapping=meta(f"{ARCH}.final_logit_softcapping", None),
        hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings="output.weight" not in tensor_shapes,
        bos_token_id=meta("tokenizer.ggml.bos_token_id", None),
        eos_token_id=meta("tokenizer.ggml.eos_token_id", None),
        pad_token_id=meta("tokenizer.ggml.padding_token_id", None),
    )
