"""phi3 GGUF files (tests/loader/gguf_writer.py: llama.cpp's fused attn_qkv / ffn_up tensors,
LongRoPE factors as rope_factors_short / rope_factors_long): a tiny Phi-3 with plain RoPE and
one with LongRoPE over a 32-token original length and partial rotary (Phi-4-mini style),
F32 GGUF equal to HF on the source checkpoint (greedy tokens, 8 prompts; the LongRoPE prompts
cross the original length while decoding)."""

from __future__ import annotations

import pytest

from pagedllm.loader import load_checkpoint
from pagedllm.loader.cache import CACHE_DIR_ENV
from tests.loader.gguf_writer import write_gguf
from tests.model.family_checkpoints import make_family_checkpoint
from tests.model.test_phi3_longrope import LONGROPE
from tests.model.test_vs_hf import PROMPTS, assert_matches_hf


@pytest.fixture(scope="module")
def phi3_files(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("phi3_gguf")
    plain = make_family_checkpoint(root / "plain", "phi3", tiny_tokenizer, seed=60)
    longrope = make_family_checkpoint(
        root / "longrope", "phi3", tiny_tokenizer, seed=61, **LONGROPE
    )
    return {
        "plain": (plain, write_gguf(plain, root / "plain.gguf", "phi3")),
        "longrope": (longrope, write_gguf(longrope, root / "longrope.gguf", "phi3")),
    }


def test_longrope_config_from_the_file(phi3_files, tmp_path) -> None:
    src, path = phi3_files["longrope"]
    config = load_checkpoint(str(path), cache_dir=tmp_path).config
    rope = config.rope_parameters
    assert rope["rope_type"] == "longrope" and rope["partial_rotary_factor"] == 0.75
    assert rope["short_factor"] == pytest.approx(LONGROPE["rope_parameters"]["short_factor"])
    assert rope["long_factor"] == pytest.approx(LONGROPE["rope_parameters"]["long_factor"])
    assert config.original_max_position_embeddings == 32
    assert config.max_position_embeddings == 128


@pytest.mark.parametrize("kind", ["plain", "longrope"])
def test_phi3_gguf_matches_hf(
    kind, phi3_files, tmp_path, monkeypatch, make_llm, hf_reference
) -> None:
    src, path = phi3_files[kind]
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    llm = make_llm(path, max_model_len=128)
    assert type(llm.llm_engine.model).__name__ == "Phi3ForCausalLM"
    assert llm.llm_engine.model.model.rotary.is_dynamic == (kind == "longrope")
    assert_matches_hf(llm, src, hf_reference, PROMPTS)
