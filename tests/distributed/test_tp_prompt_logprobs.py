"""Prompt logprobs under tensor parallelism: rank 0 sends the prompt rows with the sampling
rows and every rank computes their logits in the same slices (ModelRunner.replay), so TP=2
scores every prompt position as TP=1 does, under chunked prefill (24-token budget) and next
to requests that do not ask."""

from __future__ import annotations

import pytest

from pagedllm import SamplingParams
from pagedllm.config import EngineConfig
from pagedllm.engine.llm_engine import LLMEngine
from tests.distributed.tp_harness import engine_kwargs, prompts


def _score(model_dir, tp: int) -> list:
    engine = LLMEngine(EngineConfig(**engine_kwargs(model_dir, tp, 2**22)))
    try:
        scored = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=2)
        plain = SamplingParams(max_tokens=3, temperature=0.0)
        ids = [
            engine.add_request(p, scored if i % 2 == 0 else plain) for i, p in enumerate(prompts())
        ]
        done = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out
        engine.check_idle()
        return [done[rid] for rid in ids]
    finally:
        engine.shutdown()


def test_tp2_prompt_logprobs_match_tp1(tiny_llama_dir, monkeypatch):
    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "60")
    one, two = _score(tiny_llama_dir, 1), _score(tiny_llama_dir, 2)
    for i, (a, b) in enumerate(zip(one, two, strict=True)):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        if i % 2:
            assert a.prompt_logprobs is None and b.prompt_logprobs is None
            continue
        assert len(a.prompt_logprobs) == len(b.prompt_logprobs) == len(prompts()[i])
        for ea, eb in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:], strict=True):
            assert list(ea) == list(eb)
            for tid, lp in ea.items():
                assert eb[tid].logprob == pytest.approx(lp.logprob, abs=1e-5)
                assert eb[tid].rank == lp.rank
