"""TP=2 against TP=1 on olmo2 and glm4 GGUF files kept quantized (Q8_0, tests/loader/
gguf_writer.py: llama.cpp's layouts): each rank cuts its rows / whole 32-value blocks from the
file's bytes (quant/gguf_matrix.py); OLMo 2's q/k norms over all heads, GLM-4's q/k rows
reordered while each rank builds its part and its fused gate/up cut part by part. Greedy
tokens equal and logits within the summation-order noise of the quantized kernels (as
tests/distributed/test_tp_gguf.py), under chunked prefill, prefix caching and preemption."""

from __future__ import annotations

import gguf
import pytest
import torch

from pagedllm.loader.cache import CACHE_DIR_ENV
from tests.distributed.tp_harness import generate
from tests.loader.gguf_writer import write_gguf
from tests.model.family_checkpoints import make_family_checkpoint


@pytest.mark.parametrize("arch", ["olmo2", "glm4"])
def test_tp2_on_a_quantized_gguf_family_matches_tp1(arch, tmp_path, tiny_tokenizer,
                                                    monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "60")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    src = make_family_checkpoint(tmp_path / "hf", arch, tiny_tokenizer, seed=41)
    path = write_gguf(src, tmp_path / f"{arch}-q8_0.gguf", arch, gguf.GGMLQuantizationType.Q8_0)

    def rank0_keeps_blocks(engine) -> None:
        """Rank 0 holds half the q/k/v rows (2 of 4 query heads, 1 of 2 KV heads), quantized."""
        cfg = engine.model.config
        head_dim = cfg.hidden_size // cfg.num_attention_heads
        rows = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * head_dim // 2
        attn = engine.model.model.layers[0].self_attn
        qkv = next(m.method for m in attn.modules() if hasattr(m, "method"))
        assert qkv.shape == (rows, cfg.hidden_size)
        # one fused GGUF weight where the parts are whole panels (AVX2's 16-row panels), else
        # the parts side by side (quant/base.concat_quantized)
        assert all(p.format.startswith("gguf") for p in getattr(qkv, "parts", [qkv])), qkv

    tokens1, logits1 = generate(path, 1, "recompute", int8_activations=False)
    tokens2, logits2 = generate(path, 2, "recompute", check=rank0_keeps_blocks,
                                int8_activations=False)
    assert tokens2 == tokens1
    for a, b in zip(logits1, logits2, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=2e-4)
