"""Granite 3.x (`GraniteForCausalLM`): the Llama decoder with four scalar multipliers, as HF
transformers applies them:

    x      = embed(ids) * embedding_multiplier
    scores = q . k * attention_multiplier           (instead of 1 / sqrt(head_dim))
    x      = x + attn(norm(x)) * residual_multiplier
    x      = x + mlp(norm(x))  * residual_multiplier
    logits = lm_head(norm(x)) / logits_scaling

Weight names are Llama's.
"""

from __future__ import annotations

import torch

from pagedllm.errors import ModelLoadError
from pagedllm.model.layers.rotary import RopeBatch, RotaryEmbedding, sequence_lengths
from pagedllm.model.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)


class GraniteAttention(LlamaAttention):
    def __init__(self, config, rotary: RotaryEmbedding) -> None:
        super().__init__(config, rotary)
        self.scale = float(config.attention_multiplier)


class GraniteDecoderLayer(LlamaDecoderLayer):
    """Llama's fused (x, residual) layer with both sublayer outputs scaled before they join
    the residual stream."""

    attention_cls = GraniteAttention

    def __init__(self, config, rotary: RotaryEmbedding) -> None:
        if getattr(config, "mlp_bias", False):  # Llama's MLP has no biases
            raise ModelLoadError("Granite with mlp_bias = true is not supported")
        super().__init__(config, rotary)
        self.residual_multiplier = float(config.residual_multiplier)

    def forward(self, x, residual, rope, kv_cache, meta):
        h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, rope, kv_cache, meta) * self.residual_multiplier
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h) * self.residual_multiplier, residual


class GraniteModel(LlamaModel):
    layer_cls = GraniteDecoderLayer

    def __init__(self, config) -> None:
        super().__init__(config)
        self.embedding_multiplier = float(config.embedding_multiplier)

    def forward(self, input_ids, positions, max_pos, kv_caches, meta):
        x = self.embed_tokens(input_ids) * self.embedding_multiplier
        seq_lens = sequence_lengths(positions, meta) if self.rotary.is_dynamic else None
        rope = RopeBatch(self.rotary.halves(positions, max_pos, seq_lens))
        residual = None
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            x, residual = layer(x, residual, rope, kv, meta)
        x, _ = self.norm(x, residual)
        return x


class GraniteForCausalLM(LlamaForCausalLM):
    model_cls = GraniteModel

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float() / self.config.logits_scaling
