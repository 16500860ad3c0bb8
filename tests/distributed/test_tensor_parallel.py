"""TP=2 (two processes, gloo, 1 thread each) against TP=1 on the same weights (Llama, Qwen2,
GQA with uneven heads, Qwen3's q/k norms, Gemma 3's per-layer windows in one block table): greedy tokens
identical and every logits row rank 0 computes within 1e-5, under chunked prefill (24-token
budget), prefix caching (shared 40-token prefix, then the same prompts again) and
preemption (8 blocks for 4 requests that need 10; Qwen2 swaps the victims' blocks to CPU
and back, the others recompute)."""

from __future__ import annotations

import pytest
import torch
import transformers

from pagedllm.config import EngineConfig
from pagedllm.distributed.sharding import TPLayout
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.model.models.llama import model_dims
from tests.conftest import make_tiny_checkpoint
from tests.distributed.tp_harness import engine_kwargs, prompts, record_logits, run

NUM_BLOCKS = 8


@pytest.fixture(scope="module")
def tiny_gqa_dir(tmp_path_factory, tiny_tokenizer):
    """6 query heads over 3 KV heads (3 does not divide by 2) and an odd vocabulary."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("gqa"), "llama", tiny_tokenizer,
                                seed=4, hidden_size=48, num_attention_heads=6,
                                num_key_value_heads=3, vocab_size=515)


def _budget(model_dir, tp: int) -> int:
    """Bytes for NUM_BLOCKS blocks on the fullest rank, so both runs schedule alike."""
    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    heads, kv_heads, head_dim = model_dims(cfg)
    if tp > 1:
        kv_heads = TPLayout.for_model(cfg, 0, tp).max_local_kv_heads
    return NUM_BLOCKS * 2 * cfg.num_hidden_layers * kv_heads * head_dim * 4 * 16


def _generate(model_dir, tp: int, preemption_mode: str):
    # One block table at TP=1 too (TP always has one), so both runs plan the same blocks.
    engine = LLMEngine(EngineConfig(**engine_kwargs(model_dir, tp, _budget(model_dir, tp),
                                                    preemption_mode=preemption_mode,
                                                    swap_space=0.01,
                                                    disable_hybrid_kv_cache_manager=True)))
    try:
        assert engine.num_blocks == NUM_BLOCKS
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


@pytest.mark.parametrize(("model", "preemption_mode"), [
    ("tiny_llama_dir", "recompute"), ("tiny_qwen2_dir", "swap"), ("tiny_gqa_dir", "recompute"),
    ("tiny_qwen3_dir", "recompute"), ("tiny_gemma3_dir", "swap")])
def test_tp2_matches_tp1(model, preemption_mode, request, monkeypatch):
    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "60")
    model_dir = request.getfixturevalue(model)
    tokens1, logits1 = _generate(model_dir, 1, preemption_mode)
    tokens2, logits2 = _generate(model_dir, 2, preemption_mode)
    assert tokens2 == tokens1
    assert len(logits2) == len(logits1)
    for a, b in zip(logits1, logits2, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
