"""OLMoE (`OlmoeForCausalLM`): a MoE decoder (models/moe.py) whose attention normalizes q
and k before RoPE. As HF transformers computes it:

    q = q_norm(q_proj(x)), k = k_norm(k_proj(x))   RMSNorm over all heads together
                                                   ([H * d] and [KVH * d]), not per head
    q, k, v clamped to [-clip_qkv, clip_qkv] when the config sets clip_qkv
    then RoPE and attention as Llama's
"""

from __future__ import annotations

import torch

from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.norm import RMSNorm
from pagedllm.model.layers.rotary import RopeBatch, RotaryEmbedding
from pagedllm.model.models.llama import LlamaAttention
from pagedllm.model.models.moe import MoEForCausalLM, MoEModel


class OlmoeAttention(LlamaAttention):
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


class OlmoeModel(MoEModel):
    attention_cls = OlmoeAttention


class OlmoeForCausalLM(MoEForCausalLM):
    model_cls = OlmoeModel
