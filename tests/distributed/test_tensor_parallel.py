"""TP=2 (two processes, gloo, 1 thread each) against TP=1 on the same weights (Llama, Qwen2,
GQA with uneven heads, Qwen3's q/k norms, Gemma 3's per-layer windows in one block table): greedy tokens
identical and every logits row rank 0 computes within 1e-5, under chunked prefill (24-token
budget), prefix caching (shared 40-token prefix, then the same prompts again) and
preemption (8 blocks for 4 requests that need 10; Qwen2 swaps the victims' blocks to CPU
and back, the others recompute)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_tiny_checkpoint
from tests.distributed.tp_harness import generate


@pytest.fixture(scope="module")
def tiny_gqa_dir(tmp_path_factory, tiny_tokenizer):
    """6 query heads over 3 KV heads (3 does not divide by 2) and an odd vocabulary."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("gqa"), "llama", tiny_tokenizer,
                                seed=4, hidden_size=48, num_attention_heads=6,
                                num_key_value_heads=3, vocab_size=515)


@pytest.mark.parametrize(("model", "preemption_mode"), [
    ("tiny_llama_dir", "recompute"), ("tiny_qwen2_dir", "swap"), ("tiny_gqa_dir", "recompute"),
    ("tiny_qwen3_dir", "recompute"), ("tiny_gemma3_dir", "swap")])
def test_tp2_matches_tp1(model, preemption_mode, request, monkeypatch):
    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "60")
    model_dir = request.getfixturevalue(model)
    tokens1, logits1 = generate(model_dir, 1, preemption_mode)
    tokens2, logits2 = generate(model_dir, 2, preemption_mode)
    assert tokens2 == tokens1
    assert len(logits2) == len(logits1)
    for a, b in zip(logits1, logits2, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
