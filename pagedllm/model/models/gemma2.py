"""Gemma 2 (`Gemma2ForCausalLM`): Gemma 3's decoder (models/gemma3.py) without the q/k norms.

As HF transformers computes it: sliding-window and full layers alternate (`layer_types`), one
RoPE base for both, scores * query_pre_attn_scalar^-0.5 soft-capped by
tanh(s / attn_logit_softcapping) * attn_logit_softcapping, final logits soft-capped by
final_logit_softcapping, `(1 + w)` RMSNorms before and after both sublayers, embeddings
* sqrt(hidden), gelu-tanh MLP. Weight names are Gemma 3's without the q/k norms.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.rotary import RopeBatch
from pagedllm.model.models.gemma3 import (
    SLIDING,
    Gemma3DecoderLayer,
    Gemma3ForCausalLM,
    Gemma3Model,
)
from pagedllm.model.models.llama import model_dims


class Gemma2Attention(nn.Module):
    def __init__(self, config, layer_type: str) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = model_dims(config)
        bias = bool(getattr(config, "attention_bias", False))
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=bias, combine="sum")
        self.scale = float(config.query_pre_attn_scalar) ** -0.5
        self.softcap = getattr(config, "attn_logit_softcapping", None)
        self.window = config.sliding_window if layer_type == SLIDING else None

    def forward(
        self, x: torch.Tensor, rope: RopeBatch, kv_cache: LayerKVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        rope.rotate_qk_(qkv, self.num_heads, self.num_kv_heads, self.head_dim)
        out = meta.backend.forward_qkv(
            qkv,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            kv_cache,
            meta.for_layer(kv_cache, self.window),
            self.scale,
            softcap=self.softcap,
        )
        return self.o_proj(out)


class Gemma2DecoderLayer(Gemma3DecoderLayer):
    attention_cls = Gemma2Attention


class Gemma2Model(Gemma3Model):
    layer_cls = Gemma2DecoderLayer


class Gemma2ForCausalLM(Gemma3ForCausalLM):
    """Gemma 2; windows are per layer, as Gemma 3's."""

    model_cls = Gemma2Model
