"""Mixture-of-experts decoders: the Llama decoder with a `FusedMoE` block in place of the MLP
on its sparse layers (model/layers/moe/).

    family      HF architecture         attention                      MoE block
    Mixtral     MixtralForCausalLM      Llama's (sliding window)       block_sparse_moe: w1/w3/w2
    Qwen2-MoE   Qwen2MoeForCausalLM     q/k/v bias (`qkv_bias`)        + sigmoid-gated shared expert
    Qwen3-MoE   Qwen3MoeForCausalLM     Qwen3's q/k norm per head
    OLMoE       OlmoeForCausalLM        q/k norm over all heads, clip  (olmoe.py)

Expert weights load per expert (`...experts.{e}.gate_proj.weight`, Mixtral's `w1` / `w3` /
`w2`) or stacked as HF transformers 5 holds them (`...experts.gate_up_proj`, `down_proj`);
everything else loads as Llama's weights do.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from pagedllm.errors import ModelLoadError
from pagedllm.model.layers.embedding import VocabEmbedding
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.moe import FusedMoE, MoESpec, StackedExperts
from pagedllm.model.layers.norm import RMSNorm
from pagedllm.model.layers.quant import QuantizedWeight
from pagedllm.model.layers.rotary import RotaryEmbedding
from pagedllm.model.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaMLP,
    LlamaModel,
    model_dims,
)
from pagedllm.model.models.qwen3 import Qwen3Attention

logger = logging.getLogger(__name__)

_PER_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight$")
_STACKED_EXPERTS = re.compile(r"^(.*\.experts)\.(gate_up_proj|down_proj)$")
_PART = {
    "gate_proj": "gate",
    "w1": "gate",
    "up_proj": "up",
    "w3": "up",
    "down_proj": "down",
    "w2": "down",
}


class MoEDecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm layer around `attention_cls` and `mlp` (a FusedMoE or a dense MLP)."""

    def __init__(
        self, config, rotary: RotaryEmbedding, attention_cls: type[nn.Module], mlp: nn.Module
    ) -> None:
        nn.Module.__init__(self)
        self.self_attn = attention_cls(config, rotary)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class MoEModel(LlamaModel):
    attention_cls: type[nn.Module] = LlamaAttention  # families swap it
    fused_layer = MoEDecoderLayer  # MoE blocks run in the C++ loop (FusedMoE.fused_ref)

    def __init__(self, config) -> None:
        nn.Module.__init__(self)
        spec = self.moe_spec_for(config)
        if spec is None:
            raise ModelLoadError(
                f"model_type {config.model_type!r} is not a known mixture-of-experts family"
            )
        _, _, head_dim = model_dims(config)
        self.rotary = RotaryEmbedding.from_config(config, head_dim)
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            MoEDecoderLayer(
                config,
                self.rotary,
                self.attention_cls,
                FusedMoE.from_spec(spec) if sparse else LlamaMLP(config),
            )
            for sparse in spec.sparse_layers
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    @staticmethod
    def moe_spec_for(config) -> MoESpec | None:
        """The MoE blocks' shape (a family reads a tensor-parallel rank's share here)."""
        return MoESpec.from_config(config)


class MoEForCausalLM(LlamaForCausalLM):
    """A MoE decoder + lm_head; loads expert weights into the stacked experts."""

    model_cls = MoEModel
    renames: tuple[tuple[str, str], ...] = ()  # HF name fragment -> this model's

    def __init__(self, config) -> None:
        super().__init__(config)
        self.moe_spec = MoESpec.from_config(config)
        # Parameters outside the MLPs (attention, norms, embeddings), counted before loading
        # frees dense layouts: the part of the model every token uses.
        self.other_parameters = sum(
            p.numel()
            for n, p in self.named_parameters()
            if ".mlp." not in n and not (n == "lm_head.weight" and self.tie_word_embeddings)
        )

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor | QuantizedWeight]]) -> None:
        experts = {name: m for name, m in self.named_modules() if isinstance(m, StackedExperts)}
        loaded: dict[str, set[tuple[int, str]]] = {name: set() for name in experts}

        def rest() -> Iterator[tuple[str, torch.Tensor | QuantizedWeight]]:
            for name, tensor in weights:
                for old, new in self.renames:
                    name = name.replace(old, new)
                if hit := (_PER_EXPERT.match(name) or _STACKED_EXPERTS.match(name)):
                    module = hit.group(1)
                    if module not in experts:
                        raise ModelLoadError(f"checkpoint has unexpected weight {name!r}")
                    loaded[module] |= _load_experts(experts[module], hit, tensor)
                    continue
                yield name, tensor

        super().load_weights(rest())
        for name, module in experts.items():
            if len(loaded[name]) != 3 * module.num_experts:
                held = range(module.first_expert, module.first_expert + module.num_experts)
                want = {(e, p) for e in held for p in ("gate", "up", "down")}
                raise ModelLoadError(
                    f"checkpoint is missing expert weights of {name!r}: "
                    f"(expert, part) {sorted(want - loaded[name])[:8]}"
                )
        for module in experts.values():
            module.finalize()
        self._log_experts(experts)

    def expected_weights(self, params: dict[str, nn.Parameter]) -> set[str]:
        return {
            name
            for name in super().expected_weights(params)
            if not _STACKED_EXPERTS.match(name.partition(":")[0])
        }

    def _log_experts(self, experts: dict[str, StackedExperts]) -> None:
        spec = self.moe_spec
        total, active = spec.mlp_parameters()
        other = self.other_parameters
        expert_bytes = sum(m.weight_nbytes for m in experts.values())
        logger.info(
            "mixture of experts: %s; %.1fM of %.1fM parameters active per token; "
            "routed experts hold %.1f MiB",
            spec.describe(),
            (other + active) / 1e6,
            (other + total) / 1e6,
            expert_bytes / 2**20,
        )


def _load_experts(
    module: StackedExperts, hit: re.Match, tensor: torch.Tensor
) -> set[tuple[int, str]]:
    """Copy a per-expert or a stacked expert tensor; the (expert, part) pairs it filled."""
    if hit.re is _PER_EXPERT:  # float or quantized (kept as it is)
        expert, part = int(hit.group(2)), _PART[hit.group(3)]
        module.load_expert(expert, part, tensor)
        return {(expert, part)}
    if isinstance(tensor, QuantizedWeight):
        raise ModelLoadError(
            f"stacked expert weight {hit.group(0)!r} is quantized ({tensor!r}); "
            "only per-expert quantized weights are supported"
        )
    param = module.gate_up_proj if hit.group(2) == "gate_up_proj" else module.down_proj
    if tuple(tensor.shape) != tuple(param.shape):
        raise ModelLoadError(
            f"stacked expert weight {hit.group(0)!r} has shape "
            f"{tuple(tensor.shape)}; the layer expects {tuple(param.shape)}"
        )
    param.copy_(tensor)
    parts = ("gate", "up") if hit.group(2) == "gate_up_proj" else ("down",)
    held = range(module.first_expert, module.first_expert + module.num_experts)
    return {(e, p) for e in held for p in parts}


class Qwen2MoeAttention(LlamaAttention):
    """Qwen2-MoE: q/k/v bias as `qkv_bias` says (on by default), no o_proj bias; its own
    sliding `window` (None: full attention; set per layer by `Qwen2MoeModel`)."""

    def __init__(self, config, rotary: RotaryEmbedding) -> None:
        super().__init__(config, rotary)
        if getattr(config, "qkv_bias", True) and self.qkv_proj.bias is None:
            self.qkv_proj = Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=True)



def qwen2_moe_windows(config) -> list[int | None]:
    """Each layer's sliding window as HF transformers 5's Qwen2-MoE applies it: with
    `use_sliding_window`, the layers `layer_types` marks "sliding_attention" (by default the
    even layers below `max_window_layers`) see the last `sliding_window` keys; else none."""
    window = getattr(config, "sliding_window", None)
    if not getattr(config, "use_sliding_window", False) or not window:
        return [None] * config.num_hidden_layers
    types = getattr(config, "layer_types", None) or [
        "sliding_attention" if i % 2 == 0 and i < config.max_window_layers else "full_attention"
        for i in range(config.num_hidden_layers)]
    if len(types) != config.num_hidden_layers:
        raise ModelLoadError(f"Qwen2-MoE layer_types names {len(types)} layers; the model has "
                             f"{config.num_hidden_layers}")
    return [window if t == "sliding_attention" else None for t in types]


class MixtralModel(MoEModel):
    attention_cls = LlamaAttention


class MixtralForCausalLM(MoEForCausalLM):
    model_cls = MixtralModel
    renames = ((".block_sparse_moe.", ".mlp."),)


class Qwen2MoeModel(MoEModel):
    attention_cls = Qwen2MoeAttention
    fused_attention = (Qwen2MoeAttention,)  # Llama's, with q/k/v biases and its window

    def __init__(self, config) -> None:
        super().__init__(config)
        for layer, window in zip(self.layers, qwen2_moe_windows(config), strict=True):
            layer.self_attn.window = window


class Qwen2MoeForCausalLM(MoEForCausalLM):
    model_cls = Qwen2MoeModel
    per_layer_sliding_window = True  # the engine must not apply config.sliding_window to all
    layer_windows = staticmethod(qwen2_moe_windows)  # the KV groups' windows (model_setup)


class Qwen3MoeModel(MoEModel):
    attention_cls = Qwen3Attention
    fused_attention = (Qwen3Attention,)


class Qwen3MoeForCausalLM(MoEForCausalLM):
    model_cls = Qwen3MoeModel
