"""A decode step through every decoder layer in one C++ call (Llama family, Gemma 3; CPU).

Decoding a few sequences on CPU spends a large share of each step in Python: per layer ~10
module calls and ~10 op dispatches at ~3-5 us each, 1.5-2.5 ms of a ~13 ms SmolLM2 step.
`FusedDecode` hands the layer loop to kernels/decode_layers_cpu.cpp, which calls the same
kernels in the same order (results equal to the bit; tests/model/test_fused_decode.py).

A layer's MLP is Llama's (gate_up, down) or a mixture-of-experts block (`FusedMoE`: Mixtral,
Qwen2-MoE with its shared expert, Qwen3-MoE, softmax top-k routing; kernels/moe_decode_cpu.h),
which answers its own `fused_ref`. Gemma 3's layer is the other kind the loop runs: (1 + w)
norms, a norm after the attention and on both sides of the MLP, a GELU gate (`gemma` below:
the layer has `pre_feedforward_layernorm`). Each layer attends within its own window and its
KV group's (`window`, core/kv_groups.py) and rotates by one of the model's RoPE tables
(`layer_ropes`: Gemma 3's sliding and full layers have different bases).

`FusedDecode.build(model)` returns None when a layer has anything the C++ loop does not do:
another layer or attention type than the model names (`fused_layer`, `fused_attention`:
OLMoE's q/k norms over all heads and clipping, OLMo 2's post-norms, ...; the per-head q/k
norms of Qwen3 and Gemma 3 the loop does), logit soft-capping (Gemma 2), LoRA or tensor
parallelism on a linear layer, a weight format without a C++ reference (each format answers
`fused_ref`; int8, W8A8 and AWQ / GPTQ int4 weights call the "int" module's kernels by
address, GPTQ's act-order has none), a MoE block the loop cannot run (DeepSeek's routing,
split experts), no CPU kernels, or PAGEDLLM_FUSED_DECODE=0 in the environment (to measure the
difference). Each step the model asks its attention backend whether the step may take the
loop (`meta.backend.fused_decode_applies`): only the C++ CPU backend says yes (fp32 on CPU,
settled when it was selected), for decode-only steps (every row one token of its own
sequence; model/layers/attention_backends/cpu.py).
"""

from __future__ import annotations

import os

import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.moe import FusedMoE
from pagedllm.model.layers.norm import GemmaRMSNorm, RMSNorm
from pagedllm.model.layers.rotary import RopeBatch


class FusedDecode:
    """The C++ layer loop of one model (module docstring); built once, called per step."""

    def __init__(self, ops, layers: list, num_heads: int, num_kv_heads: int, head_dim: int,
                 scale: float, eps: float, final_norm: torch.Tensor | None = None) -> None:
        self.ops, self.layers = ops, layers
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale, self.eps = scale, eps
        # The model's final RMSNorm weight when the loop applies it too (its ~10 Python /
        # dispatch steps ran at ~70 us after the layers had streamed the weights through the
        # caches), else None: the caller norms.
        self.final_norm = final_norm

    @property
    def applies_final_norm(self) -> bool:
        return self.final_norm is not None

    @classmethod
    def build(cls, decoder_layers, layer_type: type,
              attention_types: type | tuple[type, ...],
              final_norm: torch.nn.Module | None = None,
              layer_ropes: list[int] | None = None) -> FusedDecode | None:
        """For a ModuleList of exactly `layer_type` layers (attention exactly one of
        `attention_types`) whose linear layers and MoE blocks all have C++ references; else
        None. `final_norm`: the model's norm after the last layer, which the loop applies when
        it is of the layers' kind with their eps; `layer_ropes`: each layer's RoPE table
        (None: one table)."""
        if os.environ.get("PAGEDLLM_FUSED_DECODE", "1") == "0":  # the Python layers, to compare
            return None
        ops = cpu_ops.load()
        if ops is None or not hasattr(ops, "decode_layers") or not len(decoder_layers):
            return None
        if not isinstance(attention_types, tuple):
            attention_types = (attention_types,)
        ropes = layer_ropes or [0] * len(decoder_layers)
        refs = [cls._layer_ref(ops, layer, layer_type, attention_types, rope)
                for layer, rope in zip(decoder_layers, ropes, strict=True)]
        if any(r is None for r in refs):
            return None
        first = decoder_layers[0]
        attn, eps = first.self_attn, first.input_layernorm.eps
        norm = (final_norm.weight if type(final_norm) is type(first.input_layernorm)
                and final_norm.eps == eps else None)
        return cls(ops, refs, attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.scale,
                   eps, norm)

    @staticmethod
    def _layer_ref(ops, layer, layer_type: type, attention_types: tuple[type, ...],
                   rope: int):
        """The C++ loop's `DecodeLayer` of one layer, or None where it cannot run it."""
        attn, mlp = layer.self_attn, layer.mlp
        if (type(layer) is not layer_type or type(attn) not in attention_types
                or getattr(attn, "softcap", None)):
            return None
        if isinstance(mlp, FusedMoE):
            refs = {"moe": mlp.fused_ref(ops)}
        else:
            refs = {"gate_up": mlp.gate_up_proj.fused_ref(ops),
                    "down": mlp.down_proj.fused_ref(ops)}
        linears = [attn.qkv_proj.fused_ref(ops), attn.o_proj.fused_ref(ops)]
        sandwich = [n for n in (getattr(layer, "pre_feedforward_layernorm", None),
                                getattr(layer, "post_feedforward_layernorm", None))
                    if n is not None]
        kind = GemmaRMSNorm if sandwich else RMSNorm  # Gemma 3's layer: its norms are Gemma's
        norms = [layer.input_layernorm, layer.post_attention_layernorm, *sandwich]
        head_norms = [n for n in (getattr(attn, "q_norm", None), getattr(attn, "k_norm", None))
                      if n is not None]
        if (any(r is None for r in (*linears, *refs.values()))
                or any(type(n) is not kind for n in (*norms, *head_norms))
                or len({n.eps for n in (*norms, *head_norms)}) != 1
                or len(head_norms) not in (0, 2) or len(sandwich) not in (0, 2)
                or (sandwich and "moe" in refs)):
            return None
        if head_norms:
            refs.update(q_norm=head_norms[0].weight, k_norm=head_norms[1].weight)
        if sandwich:
            refs.update(pre_ff_norm=sandwich[0].weight, post_ff_norm=sandwich[1].weight)
        return ops.DecodeLayer(norms[0].weight, norms[1].weight, *linears, **refs,
                               window=attn.window or 0, rope=rope)

    def __call__(self, x: torch.Tensor, tables: list[torch.Tensor],
                 kv_caches: list[LayerKVCache], meta: AttentionMetadata
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h, residual) after the last layer, before the final norm, or after it when
        `applies_final_norm` (x is overwritten). `tables`: the rows' RoPE rows of each table
        the layers name."""
        groups = self.kv_groups(meta)
        return self.ops.decode_layers(
            x.contiguous(), self.layers, self.num_heads, self.num_kv_heads, self.head_dim,
            self.scale, self.eps, tables, *self.cache_args(kv_caches),
            [g.slot_mapping for g in groups], [g.decode_block_tables for g in groups],
            meta.decode_seq_lens, self.group_windows(groups), self.final_norm)

    @staticmethod
    def kv_groups(meta: AttentionMetadata) -> list[AttentionMetadata]:
        """The step's metadata of each KV group ([meta] with one group)."""
        return meta.groups or [meta]

    @staticmethod
    def group_windows(groups: list[AttentionMetadata]) -> list[int]:
        """Each KV group's sliding window as the C++ loop takes it (0: none)."""
        return [g.sliding_window or 0 for g in groups]

    @staticmethod
    def cache_args(kv_caches: list[LayerKVCache]) -> tuple[list, list, list, list, list]:
        """Every layer's K and V pools, their scale pools (empty lists for a cache without
        scales) and KV group, as the C++ loop takes them."""
        quant = kv_caches[0].k_scale is not None
        return ([c.k for c in kv_caches], [c.v for c in kv_caches],
                [c.k_scale for c in kv_caches] if quant else [],
                [c.v_scale for c in kv_caches] if quant else [], [c.group for c in kv_caches])


class FusedDecoder:
    """A decoder model whose decode steps may take the C++ loop: it names the layer and
    attention types the loop runs (`fused_layer`, `fused_attention`: a variant that swaps
    either keeps these and so the Python layers, unless it says the loop computes its layers
    too) and each layer's RoPE table (`layer_ropes`, None: one table), and has `layers` (each
    called as `layer(x, residual, rope, kv_cache, meta)`, returning (h, residual)) and the
    final `norm`."""

    fused_layer: type[torch.nn.Module]
    fused_attention: tuple[type[torch.nn.Module], ...]
    layer_ropes: list[int] | None = None

    def rope_tables(self, positions: torch.Tensor, max_pos: int) -> list[torch.Tensor]:
        """Each RoPE table's rows [T, rot] for `positions` (`layer_ropes` indexes them)."""
        raise NotImplementedError

    def embed_multiplier(self) -> torch.Tensor | None:
        """What the embedding rows are multiplied by (Gemma: sqrt(hidden)), or None."""
        return None

    def run_layers(self, x: torch.Tensor, tables: list[torch.Tensor],
                   kv_caches: list[LayerKVCache], meta: AttentionMetadata) -> torch.Tensor:
        """The layers and the final norm over the embeddings x, the rows' RoPE rows of each
        table in `tables`: one C++ call for a step the loop takes, else the Python layers,
        each with its table (`layer_ropes`)."""
        ropes = [RopeBatch(t) for t in tables]
        if meta.backend.fused_decode_applies(x, meta, kv_caches) and (
                fused := self.fused_decode()):
            x, residual = fused(x, [r.halves for r in ropes], kv_caches, meta)
            if fused.applies_final_norm:
                return x
        else:
            residual = None
            per_layer = self.layer_ropes or [0] * len(self.layers)
            for layer, rope, kv in zip(self.layers, per_layer, kv_caches, strict=True):
                x, residual = layer(x, residual, ropes[rope], kv, meta)
        x, _ = self.norm(x, residual)
        return x

    def fused_decode(self) -> FusedDecode | None:
        """The C++ decode loop over these layers, built at the first decode step (after
        loading, LoRA and tensor-parallel set-up); None if it cannot run."""
        if not hasattr(self, "_fused"):
            self._fused = FusedDecode.build(self.layers, self.fused_layer, self.fused_attention,
                                            self.norm, self.layer_ropes)
        return self._fused
