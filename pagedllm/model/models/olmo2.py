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

Under tensor parallelism each rank holds its heads' q / k features and their norm weights;
the norms need the mean square over all heads, so the ranks all-reduce their sums of squares
(with their widths) once per layer: [T, 4] numbers instead of the q / k rows themselves.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.norm import RMSNorm
from pagedllm.model.layers.parallel import output_collective
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
        self.sum_over_ranks = output_collective("sum")  # None on one rank

    def _norm_qk_(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """q, k (views into the qkv rows) RMS-normalized in place over all heads."""
        if self.sum_over_ranks is None:
            q.copy_(self.q_norm(q.contiguous())[0])
            k.copy_(self.k_norm(k.contiguous())[0])
            return
        qf, kf = q.float(), k.float()
        widths = qf.new_tensor([q.shape[1], k.shape[1]]).expand(q.shape[0], 2)
        sums = torch.cat([qf.pow(2).sum(-1, keepdim=True), kf.pow(2).sum(-1, keepdim=True),
                          widths], dim=1)
        sums = self.sum_over_ranks(sums.contiguous())  # over every rank's heads
        mean_sq = sums[:, :2] / sums[:, 2:]
        for x, f, norm, ms in ((q, qf, self.q_norm, mean_sq[:, :1]),
                               (k, kf, self.k_norm, mean_sq[:, 1:])):
            x.copy_(norm.weight * (f * torch.rsqrt(ms + norm.eps)).to(x.dtype))

    def forward(
        self, x: torch.Tensor, rope: RopeBatch, kv_cache: LayerKVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        q = qkv[:, : self.q_size]
        k = qkv[:, self.q_size : self.q_size + self.kv_size]
        self._norm_qk_(q, k)
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
