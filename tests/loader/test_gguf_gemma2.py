"""gemma2 GGUF files (tests/loader/gguf_writer.py: llama.cpp's gemma2 layout, norms stored as
1 + w) of a tiny Gemma 2 (16-token window on layer 0, soft-capping, query_pre_attn_scalar =
head_dim as llama.cpp assumes): F32 equals HF on the source checkpoint; Q8_0 kept in blocks
equals HF on the weights' Q8_0 round trip."""

from __future__ import annotations

import gguf
import pytest

from pagedllm.loader import load_checkpoint
from pagedllm.loader.cache import CACHE_DIR_ENV
from tests.loader.gguf_writer import q8_0_reference, write_gguf
from tests.model.family_checkpoints import make_family_checkpoint
from tests.model.test_vs_hf import PROMPTS, assert_matches_hf

Q8_0 = gguf.GGMLQuantizationType.Q8_0


@pytest.fixture(scope="module")
def gemma2_files(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("gemma2_gguf")
    src = make_family_checkpoint(
        root / "hf", "gemma2", tiny_tokenizer, seed=42, query_pre_attn_scalar=16
    )
    ref = q8_0_reference(src, root / "q8_0_reference")
    return {
        "f32": (write_gguf(src, root / "gemma2-f32.gguf", "gemma2"), src),
        "q8_0": (write_gguf(src, root / "gemma2-q8_0.gguf", "gemma2", Q8_0), ref),
    }


def test_config_from_metadata(gemma2_files, tmp_path) -> None:
    config = load_checkpoint(str(gemma2_files["f32"][0]), cache_dir=tmp_path).config
    assert config.architectures == ["Gemma2ForCausalLM"]
    assert config.layer_types == ["sliding_attention", "full_attention"]
    assert (config.sliding_window, config.query_pre_attn_scalar) == (16, 16)
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (3.0, 8.0)


@pytest.mark.parametrize("kind", ["f32", "q8_0"])
def test_gemma2_gguf_matches_hf(
    kind, gemma2_files, tmp_path, monkeypatch, make_llm, hf_reference
) -> None:
    path, reference = gemma2_files[kind]
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    llm = make_llm(path, max_model_len=512, int8_activations=False)
    windows = [layer.self_attn.window for layer in llm.llm_engine.model.model.layers]
    assert windows == [16, None]
    assert_matches_hf(llm, reference, hf_reference, PROMPTS)
