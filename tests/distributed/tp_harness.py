"""Shared helpers of the tensor-parallel tests: run an engine to completion, recording the
logits rank 0 computes at every step."""

from __future__ import annotations

import torch

from pagedllm import SamplingParams
from pagedllm.engine.llm_engine import LLMEngine

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
                generation_config="vllm", **extra)
