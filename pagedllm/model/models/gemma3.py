"""Gemma 3 text decoder (`Gemma3ForCausalLM`, `Gemma3TextConfig`) over a flattened batch.

What differs from Llama, each as HF transformers computes it:

    embed(ids) * sqrt(hidden)                       (cast to the weight dtype, as HF)
    per layer (config.layer_types[i]):
      sliding_attention: keys of the last `sliding_window` positions, RoPE base 10k
      full_attention:    every key,                                   RoPE base 1M
      h = input_layernorm(x)
      q, k = q_norm(q), k_norm(k) per head, then RoPE; scores * query_pre_attn_scalar^-0.5
             (soft-capped by tanh if attn_logit_softcapping is set)
      x = x + post_attention_layernorm(attn(h))
      x = x + post_feedforward_layernorm(down(gelu_tanh(gate(h')) * up(h'))),
              h' = pre_feedforward_layernorm(x)
    every RMSNorm is normed(x) * (1 + weight)
    logits soft-capped by final_logit_softcapping if set

A layer returns (h, residual) as Llama's do: the residual add after the MLP happens in the next
layer's input norm (the fused add + norm), the same sums. Decode steps take the C++ layer loop
(model/fused_decode.py), which computes these layers too.

Weight names are Llama's (q/k/v and gate/up fused the same way) plus the q/k norms and the
two feed-forward norms, so `LlamaForCausalLM.load_weights` loads them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from pagedllm.model.fused_decode import FusedDecoder
from pagedllm.model.layers.activation import gelu_tanh_and_mul
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.embedding import VocabEmbedding
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.norm import GemmaRMSNorm
from pagedllm.model.layers.rope_scaling import layer_type_rope_parameters, rope_max_len
from pagedllm.model.layers.rotary import RopeBatch, RotaryEmbedding
from pagedllm.model.models.llama import LlamaForCausalLM, model_dims
from pagedllm.model.models.qwen3 import QKNormAttention

SLIDING = "sliding_attention"
FULL = "full_attention"
LAYER_TYPES = (SLIDING, FULL)


def layer_types(config) -> list[str]:
    """Attention type of every layer; older configs give a `sliding_window_pattern` instead
    (every pattern-th layer is full)."""
    types = getattr(config, "layer_types", None)
    if types is None:
        pattern = getattr(config, "sliding_window_pattern", None) or 6
        types = [FULL if (i + 1) % pattern == 0 else SLIDING
                 for i in range(config.num_hidden_layers)]
    unknown = set(types) - set(LAYER_TYPES)
    if unknown or len(types) != config.num_hidden_layers:
        raise ValueError(f"Gemma 3 layer_types must name {config.num_hidden_layers} layers "
                         f"of {LAYER_TYPES}; got {types}")
    return list(types)


class Gemma3Attention(QKNormAttention, nn.Module):
    def __init__(self, config, layer_type: str) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = model_dims(config)
        bias = bool(getattr(config, "attention_bias", False))
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=bias, combine="sum")
        self.q_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, config.rms_norm_eps)
        self.scale = float(config.query_pre_attn_scalar) ** -0.5
        self.softcap = getattr(config, "attn_logit_softcapping", None)
        self.window = config.sliding_window if layer_type == SLIDING else None


class Gemma3MLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        act = getattr(config, "hidden_activation", "gelu_pytorch_tanh")
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"Gemma 3 hidden_activation {act!r} is not supported "
                             "(only gelu_pytorch_tanh)")
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, combine="sum")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(gelu_tanh_and_mul(self.gate_up_proj(x)))


class Gemma3DecoderLayer(nn.Module):
    attention_cls: type[nn.Module] = Gemma3Attention  # Gemma 2 swaps it (no q/k norms)

    def __init__(self, config, layer_type: str) -> None:
        super().__init__()
        self.layer_type = layer_type
        self.self_attn = self.attention_cls(config, layer_type)
        self.mlp = Gemma3MLP(config)
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, rope: RopeBatch,
                kv_cache: LayerKVCache, meta: AttentionMetadata
                ) -> tuple[torch.Tensor, torch.Tensor]:
        h, residual = self.input_layernorm(x, residual)  # x + the last layer's output, normed
        h, _ = self.post_attention_layernorm(self.self_attn(h, rope, kv_cache, meta))
        h, residual = self.pre_feedforward_layernorm(h, residual)
        h, _ = self.post_feedforward_layernorm(self.mlp(h))
        return h, residual


class Gemma3Model(FusedDecoder, nn.Module):
    layer_cls: type[Gemma3DecoderLayer] = Gemma3DecoderLayer
    # The C++ decode loop runs these layers (model/fused_decode.py); Gemma 2 swaps the layer.
    fused_layer = Gemma3DecoderLayer
    fused_attention = (Gemma3Attention,)

    def __init__(self, config) -> None:
        super().__init__()
        _, _, head_dim = model_dims(config)
        self.layer_types = layer_types(config)
        max_len = rope_max_len(config)[0]
        kinds = sorted(set(self.layer_types))
        self.rotary = nn.ModuleDict({
            t: RotaryEmbedding(head_dim, layer_type_rope_parameters(config, t),
                               int(config.max_position_embeddings), max_len)
            for t in kinds})
        if any(r.is_dynamic for r in self.rotary.values()):
            raise ValueError("dynamic NTK RoPE is not supported for Gemma 3")
        self.layer_ropes = [kinds.index(t) for t in self.layer_types]
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.embed_scale = math.sqrt(config.hidden_size)
        self.layers = nn.ModuleList(self.layer_cls(config, t) for t in self.layer_types)
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def embed_multiplier(self) -> torch.Tensor:
        """sqrt(hidden) in the table's dtype, as HF multiplies it (bf16 rounds sqrt(640))."""
        return torch.tensor(self.embed_scale, dtype=self.embed_tokens.weight.dtype)

    def rope_tables(self, positions: torch.Tensor, max_pos: int) -> list[torch.Tensor]:
        """Each RoPE table's rows for `positions`, in the order `layer_ropes` names them."""
        return [r.halves(positions, max_pos) for r in self.rotary.values()]

    def forward(self, input_ids, positions, max_pos, kv_caches, meta):
        x = self.embed_tokens(input_ids) * self.embed_multiplier()
        return self.run_layers(x, self.rope_tables(positions, max_pos), kv_caches, meta)


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 text model; windows are per layer (`AttentionMetadata.for_window`)."""

    model_cls = Gemma3Model
    per_layer_sliding_window = True  # the engine must not apply config.sliding_window to all

    def __init__(self, config) -> None:
        super().__init__(config)
        self.logit_softcap = getattr(config, "final_logit_softcapping", None)
