"""Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2) over a flattened token batch.

Config flags select the variants: `attention_bias` / Qwen2 (q/k/v bias), tied embeddings,
`head_dim`, `partial_rotary_factor`, rope scaling. q/k/v and gate/up are fused into single
matmuls; `load_weights` maps HF parameter names onto the fused shards.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from pagedllm.model.fused_decode import FusedDecoder
from pagedllm.model.layers.activation import silu_and_mul
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.embedding import VocabEmbedding
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.norm import RMSNorm
from pagedllm.model.layers.quant import QuantizedWeight, concat_quantized
from pagedllm.model.layers.rotary import RopeBatch, RotaryEmbedding, sequence_lengths

# HF name fragment -> (fused parameter fragment, shard id)
_STACKED = {
    "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
}


def model_dims(config) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim) from an HF config."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return heads, kv_heads, head_dim


class LlamaAttention(nn.Module):
    """q/k/v fused, RoPE, the step's attention backend, o_proj. `window`: this layer's own
    sliding window where a family sets one per layer (Qwen2-MoE); None: its KV group's."""

    window: int | None = None

    def __init__(self, config, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = model_dims(config)
        bias = bool(getattr(config, "attention_bias", False)) or (
            config.model_type == "qwen2")
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = Linear(self.q_size, config.hidden_size,
                             bias=bool(getattr(config, "attention_bias", False))
                             and config.model_type != "qwen2", combine="sum")
        self.rotary = rotary
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def forward(self, x: torch.Tensor, rope: RopeBatch, kv_cache: LayerKVCache,
                meta: AttentionMetadata) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        rope.rotate_qk_(qkv, self.num_heads, self.num_kv_heads, self.head_dim)
        out = meta.backend.forward_qkv(qkv, self.num_heads, self.num_kv_heads, self.head_dim,
                                       kv_cache, meta.for_layer(kv_cache, self.window),
                                       self.scale)
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.inter = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * self.inter)
        self.down_proj = Linear(self.inter, config.hidden_size, combine="sum")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj  # a Linear, or a wrapper of one (LoRA)
        if isinstance(gate_up, Linear) and (y := gate_up.gated_mlp(self.down_proj, x)) is not None:
            return y
        return self.down_proj(silu_and_mul(gate_up(x)))


class LlamaDecoderLayer(nn.Module):
    attention_cls: type[LlamaAttention] = LlamaAttention  # variants (Qwen3) swap it

    def __init__(self, config, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = self.attention_cls(config, rotary)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, residual, rope, kv_cache, meta):
        h, residual = self.input_layernorm(x, residual)
        h = self.self_attn(h, rope, kv_cache, meta)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class LlamaModel(FusedDecoder, nn.Module):
    layer_cls: type[LlamaDecoderLayer] = LlamaDecoderLayer
    # What the C++ decode loop runs (model/fused_decode.py: FusedDecoder)
    fused_layer: type[nn.Module] = LlamaDecoderLayer
    fused_attention: tuple[type[nn.Module], ...] = (LlamaAttention,)

    def __init__(self, config) -> None:
        super().__init__()
        _, _, head_dim = model_dims(config)
        self.rotary = RotaryEmbedding.from_config(config, head_dim)
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            self.layer_cls(config, self.rotary) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids, positions, max_pos, kv_caches, meta):
        seq_lens = sequence_lengths(positions, meta) if self.rotary.is_dynamic else None
        tables = [self.rotary.halves(positions, max_pos, seq_lens)]
        return self.run_layers(self.embed_tokens(input_ids), tables, kv_caches, meta)

    def rope_tables(self, positions: torch.Tensor, max_pos: int) -> list[torch.Tensor]:
        return [self.rotary.halves(positions, max_pos)]  # (not for a dynamic RoPE)


class LlamaForCausalLM(nn.Module):
    """Decoder + lm_head; `compute_logits` runs only on the rows that sample."""

    model_cls: type[nn.Module] = LlamaModel  # variants (Qwen3, Gemma 3) swap the decoder
    logit_softcap: float | None = None  # logits -> tanh(logits / cap) * cap (Gemma)

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.model = self.model_cls(config)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = Linear(config.hidden_size, config.vocab_size, combine="vocab")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, max_pos: int,
                kv_caches: list[LayerKVCache],
                meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, max_pos, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden).float()
        if cap := self.logit_softcap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor | QuantizedWeight]]) -> None:
        """Copy HF-named tensors into (fused) parameters; raises on missing/unknown names.

        A linear layer's weight may come as a `QuantizedWeight`: it is adopted as is (fused
        projections from their parts, in q, k, v / gate, up order) instead of being copied.
        That is the one check on what a weight is here: a dense tensor is copied into a
        parameter (or a slice of one), a quantized one becomes the layer's method; from then
        on the layer's method answers for it (`Linear.finalize` picks the dense layouts).
        """
        params = dict(self.named_parameters())
        modules = dict(self.named_modules())
        quant_parts: dict[str, dict[str | int, QuantizedWeight]] = {}
        _, kv_heads, head_dim = model_dims(self.config)
        q_size = self.config.num_attention_heads * head_dim
        kv_size = kv_heads * head_dim
        offsets = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            quantized = isinstance(tensor, QuantizedWeight)
            for frag, (fused, shard) in _STACKED.items():
                if f".{frag}." in name:
                    target = name.replace(frag, fused)
                    param = params[target]
                    if quantized:
                        quant_parts.setdefault(target, {})[shard] = tensor
                        loaded.add(f"{target}:{shard}")
                        break
                    if isinstance(shard, str):
                        start, size = offsets[shard]
                    else:
                        size = param.shape[0] // 2
                        start = shard * size
                    param.narrow(0, start, size).copy_(tensor)
                    loaded.add(f"{target}:{shard}")
                    break
            else:
                if name not in params:
                    raise ValueError(f"checkpoint has unexpected weight {name!r}")
                if quantized:
                    self._module_of(modules, name).set_quantized(tensor)
                else:
                    params[name].copy_(tensor)
                loaded.add(name)
        for target, parts in quant_parts.items():
            order = ("q", "k", "v") if "qkv_proj" in target else (0, 1)
            if set(parts) != set(order):
                raise ValueError(f"checkpoint has only shards {sorted(map(str, parts))} of "
                                 f"quantized {target!r}")
            self._module_of(modules, target).set_quantized(
                concat_quantized([parts[s] for s in order]))
        self.model.embed_tokens.finalize()  # its layout for the device (bf16 on CPU, ...)
        if self.tie_word_embeddings:
            if self.model.embed_tokens.quant is not None:  # one quantized table for both
                self.lm_head.set_quantized(self.model.embed_tokens.quant)
            else:
                self.lm_head.weight = self.model.embed_tokens.weight
            loaded.add("lm_head.weight")
        expected = self.expected_weights(params)
        if self.tie_word_embeddings:
            expected.add("lm_head.weight")
        missing = expected - loaded
        if missing:
            raise ValueError(f"checkpoint is missing weights: {sorted(missing)[:8]}")
        for module in self.modules():
            if isinstance(module, Linear):
                module.finalize()

    def expected_weights(self, params: dict[str, nn.Parameter]) -> set[str]:
        """What `load_weights` must have loaded: every parameter, fused ones per shard
        ("...qkv_proj.weight:q"). Variants that load some parameters themselves (the MoE
        models' stacked experts) leave those out."""
        expected = set()
        for pname in params:
            if "qkv_proj" in pname:
                expected |= {f"{pname}:{s}" for s in "qkv"}
            elif "gate_up_proj" in pname:
                expected |= {f"{pname}:0", f"{pname}:1"}
            else:
                expected.add(pname)
        return expected

    @staticmethod
    def _module_of(modules: dict[str, nn.Module], param_name: str) -> Linear | VocabEmbedding:
        """The Linear or embedding that owns parameter `param_name` (e.g. "...qkv_proj.weight")."""
        module = modules.get(param_name.rpartition(".")[0])
        if not isinstance(module, Linear | VocabEmbedding):
            raise ValueError(f"{param_name!r} is not a linear layer's or embedding's weight; it "
                             f"cannot be loaded quantized")
        return module
