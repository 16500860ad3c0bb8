"""OLMo 2 (`Olmo2ForCausalLM`) and the attention it shares with OLMoE.

What differs from Llama, as HF transformers computes it:

    q = q_norm(q_proj(h)), k = k_norm(k_proj(h))   RMSNorm over all heads together
                                                   ([H * d] and [KVH * d]), not per head
    (OLMoE only: q, k, v clamped to [-clip_qkv, clip_qkv] when the config sets clip_qkv)
    norms after the sublayers, none before:
      x = x + post_attention_layernorm(attn(x))
      x = x + post_feedforward_layernorm(mlp(x))

Weight names are Llama's plus the q/k norms and `post_feedforward_layernorm`, so
`LlamaForCausalLM.load_weights` loads them.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.norm import RMSNorm
from pagedllm.model.layers.rotary import RopeBatch, RotaryEmbedding
from pagedllm.model.models.llama import (
    LlamaAttention,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
)


class OlmoAttention(LlamaAttention):
    """Llama attention with q and k RMS-normalized over all their heads before RoPE, and
    q/k/v optionally clipped (OLMo 2, OLMoE)."""

    def __init__(self, config, rotary: RotaryEmbedding) -> None:
        super().__init__(config, rotary)
        self.q_norm = RMSNorm(self.q_size, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.kv_size, config.rms_norm_eps)
        self.clip_qkv = getattr(config, "clip_qkv", None)

    def forward(
        self, x: torch.Tensor, rope: RopeBatch, kv_cache: LayerKVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q = qkv[:, : self.q_size]
        k = qkv[:, self.q_size : self.q_size + self.kv_size]
        q.copy_(self.q_norm(q.contiguous())[0])
        k.copy_(self.k_norm(k.contiguous())[0])
        if self.clip_qkv is not None:
            qkv.clamp_(-self.clip_qkv, self.clip_qkv)
        rope.rotate_qk_(qkv, self.num_heads, self.num_kv_heads, self.head_dim)
        out = meta.backend.forward_qkv(
            qkv, self.num_heads, self.num_kv_heads, self.head_dim, kv_cache, meta, self.scale
        )
        return self.o_proj(out)


class Olmo2DecoderLayer(nn.Module):
    """Post-norm layer. It keeps `LlamaModel`'s (x, residual) contract with residual None:
    its output is the full residual stream, so the final norm sees x alone."""

    def __init__(self, config, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = OlmoAttention(config, rotary)
        self.mlp = LlamaMLP(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, residual, rope, kv_cache, meta):
        if residual is not None:
            x = x + residual
        h, _ = self.post_attention_layernorm(self.self_attn(x, rope, kv_cache, meta))
        x = x + h
        h, _ = self.post_feedforward_layernorm(self.mlp(x))
        return x + h, None


class Olmo2Model(LlamaModel):
    layer_cls = Olmo2DecoderLayer


class Olmo2ForCausalLM(LlamaForCausalLM):
    model_cls = Olmo2Model
