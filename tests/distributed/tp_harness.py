"""Shared helpers of the tensor-parallel tests: run an engine to completion, recording the
logits rank 0 computes at every step."""

from __future__ import annotations

import torch

from pagedllm import SamplingParams
from pagedllm.config import EngineConfig
from pagedllm.distributed.sharding import TPLayout
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.memory_plan import load_config
from pagedllm.model.layers.mla import latent_kv_dims
from pagedllm.model.models.llama import model_dims

PREFIX = list(range(10, 50))  # 40 shared tokens: full blocks the prefix cache can share


def prompts() -> list[list[int]]:
    return [PREFIX + [60 + i, 70 + 2 * i, 90 + 3 * i, 100 + i] for i in range(4)]


def record_logits(engine: LLMEngine) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    inner = engine.model.compute_logits

    def compute_logits(hidden):
        logits = inner(hidden)
        seen.append(logits.detach().clone())
        return logits

    engine.model.compute_logits = compute_logits
    return seen


def run(engine: LLMEngine, token_prompts: list[list[int]], max_tokens: int = 10
        ) -> dict[str, list[int]]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in token_prompts]
    done: dict[str, list[int]] = {}
    for _ in range(10_000):
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
        if not engine.has_unfinished_requests():
            break
    return {rid: done[rid] for rid in ids}


def engine_kwargs(model_dir, tp: int, budget_blocks_bytes: int, **extra) -> dict:
    return dict(model=str(model_dir), tensor_parallel_size=tp, num_threads=1,
                max_model_len=128, max_num_batched_tokens=24, block_size=16,
                kv_cache_memory=budget_blocks_bytes, enable_prefix_caching=True,
                generation_config="vllm", num_scheduler_steps=1, **extra)


NUM_BLOCKS = 8


def budget(model_dir, tp: int) -> int:
    """Bytes for NUM_BLOCKS blocks on the fullest rank, so both runs schedule alike."""
    cfg = load_config(model_dir)  # a vision-language checkpoint's language model
    if (latent := latent_kv_dims(cfg)) is not None:  # one latent row on every rank
        (kv_heads, head_dim), parts = latent, 1
    else:
        heads, kv_heads, head_dim = model_dims(cfg)
        parts = 2
        if tp > 1:
            kv_heads = TPLayout.for_model(cfg, 0, tp).max_local_kv_heads
    return NUM_BLOCKS * parts * cfg.num_hidden_layers * kv_heads * head_dim * 4 * 16


def generate(model_dir, tp: int, preemption_mode: str, check=None, **extra):
    """(greedy tokens of prompts() run twice, logits of every step) under chunked prefill,
    prefix caching (the second run) and preemption (NUM_BLOCKS blocks for 4 requests);
    `check(engine)` first looks at rank 0's model when given."""
    # One block table at TP=1 too (TP always has one), so both runs plan the same blocks.
    engine = LLMEngine(EngineConfig(**engine_kwargs(model_dir, tp, budget(model_dir, tp),
                                                    preemption_mode=preemption_mode,
                                                    swap_space=0.01,
                                                    disable_hybrid_kv_cache_manager=True,
                                                    **extra)))
    try:
        assert engine.num_blocks == NUM_BLOCKS
        if check is not None:
            check(engine)
        logits = record_logits(engine)
        first = run(engine, prompts())
        second = run(engine, prompts())  # now from the prefix cache
        stats = engine.stats
        assert stats.num_preemptions_total > 0
        assert (stats.swapped_out_blocks_total > 0) == (preemption_mode == "swap")
        assert stats.prefix_cache_hits > 0
        engine.check_idle()
        return list(first.values()) + list(second.values()), logits
    finally:
        engine.shutdown()
