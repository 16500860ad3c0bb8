"""TP=2 against TP=1 for the dense families beyond Llama / Qwen / Gemma 3 (tiny random
checkpoints of tests/model/family_checkpoints.py): Gemma 2 (per-layer window and soft-capping
in one block table), OLMo 2 (q/k norms over all heads: the ranks add their sums of squares),
Granite (scalar multipliers), SmolLM3 (a NoPE layer), Phi-3 (fused qkv / gate_up tensors cut
per rank), GLM-4 (q/k/v biases, partial interleaved RoPE, fused gate_up). Greedy tokens
identical and every logits row within 1e-5, under chunked prefill, prefix caching and
preemption (tests/distributed/tp_harness.py)."""

from __future__ import annotations

import pytest
import torch

from pagedllm.distributed.sharding import TP_ARCHITECTURES, TPLayout
from tests.distributed.tp_harness import generate
from tests.model.family_checkpoints import DENSE_FAMILIES, make_family_checkpoint

PREEMPTION = {"gemma2": "swap", "olmo2": "recompute", "granite": "swap",
              "smollm3": "recompute", "phi3": "swap", "glm4": "recompute"}


@pytest.mark.parametrize("family", sorted(DENSE_FAMILIES))
def test_tp2_matches_tp1(family, tmp_path, tiny_tokenizer, monkeypatch):
    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "60")
    assert DENSE_FAMILIES[family][1] in TP_ARCHITECTURES
    model_dir = make_family_checkpoint(tmp_path / family, family, tiny_tokenizer, seed=20)
    tokens1, logits1 = generate(model_dir, 1, PREEMPTION[family])
    tokens2, logits2 = generate(model_dir, 2, PREEMPTION[family])
    assert tokens2 == tokens1
    assert len(logits2) == len(logits1)
    for a, b in zip(logits1, logits2, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_full_width_qk_norm_needs_disjoint_kv_heads():
    import transformers

    cfg = transformers.Olmo2Config(hidden_size=48, num_attention_heads=6, num_key_value_heads=3,
                                   architectures=["Olmo2ForCausalLM"])
    with pytest.raises(ValueError, match="must divide its 6 attention heads and its 3 KV"):
        TPLayout.for_model(cfg, 0, 2)


@pytest.mark.parametrize(("family", "scale"), [("gemma3", 2.0), ("mistral3", 8.0)])
def test_vision_language_checkpoints_tp2_match_tp1(family, scale, tmp_path, tiny_tokenizer,
                                                   monkeypatch):
    """Gemma3ForConditionalGeneration / Mistral3ForConditionalGeneration served as their
    language model (loader/multimodal_text.py) split over two ranks."""
    from tests.loader.test_multimodal_text import _save

    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "60")
    model_dir = _save(tmp_path / family, tiny_tokenizer, family, scale)
    tokens1, logits1 = generate(model_dir, 1, "recompute")
    tokens2, logits2 = generate(model_dir, 2, "recompute")
    assert tokens2 == tokens1
    for a, b in zip(logits1, logits2, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)
