"""Every rule where one feature changes another, decided once per engine.

`resolve_plan(config, hf_config)` looks at what was asked for (`EngineConfig`) and what the
model is (its HF config) and returns a frozen `EnginePlan`; each decision that overrides the
user's request is logged once, here. The start-up code reads the plan and never decides a
cross-feature question itself:

    rule                                              decided by
    prefix caching off with dynamic NTK RoPE          resolve_plan (and LongRoPE: the same rule)
    prefix caching off when every layer is sliding    resolve_plan (blocks leave the window)
    prefix caching off for MEAN / CLS pooling         resolve_plan (cached positions unpooled)
    one KV group under tensor parallelism             model_setup.single_kv_group
    CUDA graphs only without speculation and TP       resolve_plan
    CUDA graphs off for mixture-of-experts models     resolve_plan (expert groups sized on host)
    a block holds target + draft KV                   split_kv_budget
    int8 activations auto                             EngineConfig.resolve_int8_activations
    KV cache dtype auto (float16 with int8 acts.)     EngineConfig.resolve_kv_cache_dtype
    linear weights' dtype auto (CPU: bf16 or fp32)    EngineConfig.resolve_linear_dtype
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pagedllm.config import EngineConfig
from pagedllm.core.kv_groups import KVGroupLayout
from pagedllm.model.layers.moe.spec import MoESpec
from pagedllm.model.layers.rope_scaling import LENGTH_DEPENDENT_ROPE_TYPES, rope_parameters
from pagedllm.pooling.setup import PoolingSetup
from pagedllm.worker.model_setup import single_kv_group

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EnginePlan:
    """The cross-feature decisions of one engine (see the module doc)."""

    prefix_caching: bool
    single_kv_group: bool
    cuda_graphs: bool


def resolve_plan(config: EngineConfig, hf_config, layout: KVGroupLayout,
                 pooling: PoolingSetup | None = None) -> EnginePlan:
    """The plan for `config` on the model of `hf_config` whose KV is laid out as `layout`
    (`pooling`: what a pooling model pools)."""
    caching = config.enable_prefix_caching
    if caching and pooling is not None and not pooling.caches_prefixes:
        logger.warning("prefix caching disabled: %s pooling needs every prompt position "
                       "computed, which a cached prefix would skip", pooling.pooling_type)
        caching = False
    rope_type = rope_parameters(hf_config).get("rope_type")
    if caching and rope_type in LENGTH_DEPENDENT_ROPE_TYPES:
        logger.warning("prefix caching disabled: with %s RoPE a key's rotation depends on "
                       "the length its sequence had when it was computed", rope_type)
        caching = False
    if caching and layout.groups[0].drops_blocks:
        logger.warning("prefix caching disabled: every layer has a sliding window whose "
                       "out-of-window blocks are freed (%s); pass "
                       "--disable-hybrid-kv-cache-manager to keep them and cache prefixes",
                       layout.describe())
        caching = False
    graphs = (config.torch_device.type == "cuda" and not config.enforce_eager
              and config.speculative_config is None and config.tensor_parallel_size == 1)
    if graphs and MoESpec.from_config(hf_config) is not None:
        logger.info("CUDA graphs off: a mixture-of-experts layer reads its tokens-per-expert "
                    "counts on the host to size each expert's GEMM")
        graphs = False
    return EnginePlan(prefix_caching=caching, single_kv_group=single_kv_group(config),
                      cuda_graphs=graphs)


def split_kv_budget(budget: int, own_bytes_per_block: int,
                    draft_bytes_per_block: int | None) -> int:
    """The target pool's share of the KV budget: with a draft model a block id holds the
    target's KV and the draft's (speculative/draft_model.py), so both pools get the same
    number of blocks."""
    if draft_bytes_per_block is None:
        return budget
    return budget * own_bytes_per_block // (own_bytes_per_block + draft_bytes_per_block)
