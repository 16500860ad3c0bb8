"""Qwen3: the Llama decoder with an RMSNorm over each q and k head before RoPE.

No qkv bias unless `attention_bias`; tied or untied embeddings as the config says. Weight
names are Llama's plus `self_attn.q_norm` / `self_attn.k_norm`.
"""

from __future__ import annotations

import torch

from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.norm import RMSNorm, head_norms_
from pagedllm.model.layers.rotary import RopeBatch, RotaryEmbedding
from pagedllm.model.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)


class QKNormAttention:
    """The forward pass of attention layers that RMS-normalize every q and k head before RoPE
    (Qwen3, Gemma 3). Subclasses provide the projections, `q_norm` / `k_norm` and `scale`;
    `window` (sliding-window layers) and `softcap` (attention logit soft-capping) are optional."""

    window: int | None = None
    softcap: float | None = None

    def forward(self, x: torch.Tensor, rope: RopeBatch, kv_cache: LayerKVCache,
                meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        head_norms_(qkv, self.q_norm, self.k_norm, self.num_heads, self.num_kv_heads,
                    self.head_dim)
        rope.rotate_qk_(qkv, self.num_heads, self.num_kv_heads, self.head_dim)
        out = meta.backend.forward_qkv(qkv, self.num_heads, self.num_kv_heads, self.head_dim,
                                       kv_cache, meta.for_layer(kv_cache, self.window),
                                       self.scale, softcap=self.softcap)
        return self.o_proj(out)


class Qwen3Attention(QKNormAttention, LlamaAttention):
    def __init__(self, config, rotary: RotaryEmbedding) -> None:
        super().__init__(config, rotary)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3Model(LlamaModel):
    layer_cls = Qwen3DecoderLayer
    fused_layer = Qwen3DecoderLayer  # the C++ decode loop normalizes q and k heads too
    fused_attention = (Qwen3Attention,)


class Qwen3ForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3Model
