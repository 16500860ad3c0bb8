"""One start-up for every rank: engine config -> checkpoint -> model -> KV spec.

The same two calls start the engine (rank 0), every tensor-parallel rank > 0
(distributed/worker.py) and the speculative draft model (speculative/draft_model.py)::

    ckpt  = prepare_checkpoint(config)     int8 and dtype auto settled, RoPE overrides,
                                           max_model_len
    parts = build_rank(config, ckpt, tp)   the model (this rank's shard), its KV spec (KV
                                           groups with their windows), attention backend

so what one of them loads, the others load the same way. The fronts (LLMEngine, the data-
parallel router) open it with engine_builder.open_checkpoint, which adds what serving needs.
`pagedllm plan` reads the KV spec through the same `model_setup.kv_spec_for`, no weights.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from torch import nn

from pagedllm import startup
from pagedllm.config import EngineConfig, KVCacheSpec
from pagedllm.kernels import cpu_ops
from pagedllm.loader import Checkpoint, load_checkpoint
from pagedllm.model.layers.attention_backends import PagedAttentionBackend, select_backend
from pagedllm.model.layers.rope_scaling import apply_rope_overrides, rope_max_len
from pagedllm.worker import model_setup

logger = logging.getLogger(__name__)


@dataclass
class RankParts:
    """What one rank runs: its model (shard), the KV spec of its pool, the pool's planning
    spec (under TP the rank with the most KV heads, so every rank fits the same block
    count; its KV groups carry the attention windows) and the attention backend that builds
    its metadata and runs its attention (model/layers/attention_backends/)."""

    model: nn.Module
    kv_spec: KVCacheSpec
    plan_kv_spec: KVCacheSpec
    attention_backend: PagedAttentionBackend


def prepare_checkpoint(config: EngineConfig) -> Checkpoint:
    """The checkpoint `config` names (the CPU kernels loaded first), with int8 activations
    settled (auto: by the CPU and the file), the linear weights' dtype settled (auto on CPU:
    by the CPU, the weights' format and saved dtype), --rope-scaling / --rope-theta applied to its
    config and max_model_len resolved against its trained length (`config.finalize`)."""
    if config.torch_device.type == "cpu":
        # Compiled on a first start (minutes), else loaded from the cache; before the
        # checkpoint, whose GGUF reader asks which kernels exist: the build is charged here.
        with startup.step("CPU kernels"):
            cpu_ops.load()
    model_setup.resolve_int8_activations(config)
    ckpt = load_checkpoint(config.model, quantization=config.quantization,
                           revision=config.revision, download_dir=config.download_dir,
                           tokenizer=config.tokenizer,
                           int8_activations=config.int8_activations)
    model_setup.resolve_linear_dtype(ckpt, config)
    apply_rope_overrides(ckpt.config, config.rope_scaling, config.rope_theta)
    config.finalize(*rope_max_len(ckpt.config))
    return ckpt


def build_rank(config: EngineConfig, ckpt: Checkpoint, tp=None) -> RankParts:
    """Build this rank's model from `ckpt` (`tp` = (TPLayout, TPGroup) for a shard), the
    spec of its KV pool and its attention backend (selected here, once)."""
    with startup.step("weights"):
        model = model_setup.build_model(ckpt, config, tp=tp)
    model_config = ckpt.config if tp is None else tp[0].model_config(ckpt.config)
    spec = model_setup.kv_spec_for(model_config, config)
    plan_spec = (spec if tp is None
                 else dataclasses.replace(spec, num_kv_heads=tp[0].max_local_kv_heads))
    backend = select_backend(config.torch_device, config.torch_dtype, spec.dtype,
                             spec.head_dim)
    logger.info("attention backend: %s (%s queries, %s KV cache, head size %d)",
                backend.name, config.torch_dtype, spec.dtype, spec.head_dim)
    return RankParts(model=model, kv_spec=spec, plan_kv_spec=plan_spec,
                     attention_backend=backend)
