"""The serving model in training mode: loading a frozen base, the padded-batch forward,
per-layer gradient checkpointing and the optional NF4 (QLoRA) base.

The forward is the engine's own `LlamaForCausalLM` / Qwen3 / Gemma 3 code: tokens are
flattened to [B*L] with positions 0..L-1 per row, and attention gets the training backend's
`CausalBatchMetadata` instead of the paged metadata (no KV cache is touched). Every base
parameter has requires_grad=False; only the LoRA A/B train.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from pagedllm.loader import Checkpoint
from pagedllm.model.layers.attention import LayerKVCache
from pagedllm.model.layers.attention_backends.training import TrainingBackend
from pagedllm.model.layers.linear import Linear
from pagedllm.model.registry import get_model_class
from pagedllm.worker.model_setup import layer_windows, weight_bytes

logger = logging.getLogger(__name__)


def load_base(ckpt: Checkpoint, device: torch.device, qlora: bool = False) -> nn.Module:
    """The base model in fp32 with dense HF-layout linears (or NF4 ones with `qlora`,
    except lm_head), every parameter frozen."""
    cls = get_model_class(getattr(ckpt.config, "architectures", None))
    with torch.device("meta"):
        model = cls(ckpt.config)
    model = model.to_empty(device=device).float()
    for m in model.modules():
        if isinstance(m, Linear):
            m.keep_dense = True
    model.load_weights(ckpt.weights())
    dense = weight_bytes(model)
    if qlora:
        from pagedllm.finetune.nf4 import NF4Weight

        for name, m in model.named_modules():
            if isinstance(m, Linear) and not name.endswith("lm_head"):
                m.set_quantized(NF4Weight(m.weight.detach()))
        logger.info("QLoRA: base linears in NF4 with double-quantized scales: weights %.1f "
                    "MiB (%.1f MiB in fp32)", weight_bytes(model) / 2**20, dense / 2**20)
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    return model


def sliding_window(model: nn.Module) -> int | None:
    """The window the model applies to every layer (Mistral; a Qwen2 whose config slides every
    layer), by the engine's own rule (`layer_windows`: a Qwen2 config that slides no layer has
    none); per-layer windows (Gemma 3, Qwen2-MoE) stay inside the layers."""
    if getattr(model, "per_layer_sliding_window", False):
        return None
    windows = set(layer_windows(model.config))
    return windows.pop() if len(windows) == 1 else None


def hidden_states(model: nn.Module, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Final hidden states [B, L, hidden] of right-padded `ids` [B, L]."""
    b, n = ids.shape
    positions = torch.arange(n, device=ids.device).repeat(b)
    meta = TrainingBackend(ids.device).build_metadata(valid.to(ids.device),
                                                      sliding_window(model))
    caches = [LayerKVCache(None, None)] * len(model.model.layers)
    hidden = model(ids.reshape(-1), positions, n - 1, caches, meta)
    return hidden.view(b, n, -1)


def logits(model: nn.Module, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """fp32 logits [B, L, V] (tests and evaluation of small batches)."""
    h = hidden_states(model, ids, valid)
    return model.compute_logits(h.reshape(-1, h.shape[-1])).view(*ids.shape, -1)


def token_loss_sum(model: nn.Module, ids: torch.Tensor, valid: torch.Tensor,
                   targets: torch.Tensor) -> torch.Tensor:
    """Sum of next-token cross-entropy over the target positions (lm_head only on them)."""
    h = hidden_states(model, ids, valid)
    keep = targets >= 0
    logit = model.compute_logits(h[keep])
    return nn.functional.cross_entropy(logit, targets[keep], reduction="sum")


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer in backward (torch.utils.checkpoint, non-reentrant)
    instead of keeping its activations; module names (and so adapter names) are unchanged."""
    for layer in model.model.layers:
        layer.forward = functools.partial(checkpoint, type(layer).forward.__get__(layer),
                                          use_reentrant=False)
