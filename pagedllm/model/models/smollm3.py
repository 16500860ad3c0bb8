"""SmolLM3 (`SmolLM3ForCausalLM`): the Llama decoder where some layers use no positional
encoding at all (NoPE), as `config.no_rope_layers` says per layer (1: RoPE, 0: none; by
default every `no_rope_layer_interval`-th layer has none).

Weight names are Llama's. Sliding-window layers (`use_sliding_window`) are refused.
"""

from __future__ import annotations

import torch

from pagedllm.errors import ModelLoadError
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.rotary import RopeBatch
from pagedllm.model.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)


class SmolLM3Attention(LlamaAttention):
    use_rope: bool = True  # SmolLM3Model sets it per layer

    def forward(
        self, x: torch.Tensor, rope: RopeBatch, kv_cache: LayerKVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        if self.use_rope:
            rope.rotate_qk_(qkv, self.num_heads, self.num_kv_heads, self.head_dim)
        out = meta.backend.forward_qkv(
            qkv, self.num_heads, self.num_kv_heads, self.head_dim, kv_cache, meta, self.scale
        )
        return self.o_proj(out)


class SmolLM3DecoderLayer(LlamaDecoderLayer):
    attention_cls = SmolLM3Attention


class SmolLM3Model(LlamaModel):
    layer_cls = SmolLM3DecoderLayer

    def __init__(self, config) -> None:
        if getattr(config, "mlp_bias", False):  # Llama's MLP has no biases
            raise ModelLoadError("SmolLM3 with mlp_bias = true is not supported")
        if getattr(config, "use_sliding_window", False):
            raise ModelLoadError("SmolLM3 with use_sliding_window = true is not supported")
        flags = list(config.no_rope_layers)
        if len(flags) != config.num_hidden_layers:
            raise ModelLoadError(
                f"SmolLM3 no_rope_layers names {len(flags)} layers; the model has "
                f"{config.num_hidden_layers}"
            )
        super().__init__(config)
        for layer, use_rope in zip(self.layers, flags, strict=True):
            layer.self_attn.use_rope = bool(use_rope)


class SmolLM3ForCausalLM(LlamaForCausalLM):
    model_cls = SmolLM3Model
