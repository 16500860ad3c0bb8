"""Llama 3.1-style GGUF files carry their llama3 RoPE scaling as `rope_freqs.weight` (one
divisor per frequency, as llama.cpp's converter computes it); the loader applies it
(`rope_freq_factors` -> rope_scaling._divided). A tiny Llama with llama3 scaling over a
64-token original length, written as GGUF: frequencies equal HF's llama3 ones, greedy tokens
and logprobs equal HF on the source checkpoint."""

from __future__ import annotations

import pytest
import torch

from pagedllm import SamplingParams
from pagedllm.loader import load_checkpoint
from pagedllm.loader.cache import CACHE_DIR_ENV
from pagedllm.model.layers.rope_scaling import compute_inv_freq, rope_parameters
from tests.conftest import make_tiny_checkpoint
from tests.loader.gguf_writer import write_gguf
from tests.model.test_vs_hf import MAX_TOKENS, PROMPTS, assert_matches_hf

LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@pytest.fixture(scope="module")
def llama3_files(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("llama3_gguf")
    src = make_tiny_checkpoint(
        root / "hf", "llama", tiny_tokenizer, seed=50, rope_parameters=LLAMA3
    )
    return src, write_gguf(src, root / "llama3-f32.gguf", "llama")


def test_rope_freqs_become_hf_llama3_frequencies(llama3_files, tmp_path) -> None:
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    src, path = llama3_files
    config = load_checkpoint(str(path), cache_dir=tmp_path).config
    assert len(config.rope_freq_factors) == 8
    got, _ = compute_inv_freq(16, rope_parameters(config), config.max_position_embeddings)
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](transformers.AutoConfig.from_pretrained(src), "cpu")
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    plain = compute_inv_freq(16, {"rope_type": "default", "rope_theta": 5e5}, 1024)[0]
    assert (got < plain).sum() >= 3  # the scaling bites on the low frequencies


def test_llama3_gguf_matches_hf(
    llama3_files, tmp_path, monkeypatch, make_llm, hf_reference
) -> None:
    src, path = llama3_files
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    llm = make_llm(path, max_model_len=512)
    assert_matches_hf(llm, src, hf_reference, PROMPTS)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    out = llm.generate({"prompt_token_ids": PROMPTS[7]}, params, use_tqdm=False)[0].outputs[0]
    _, ref = hf_reference.greedy(src, PROMPTS[7], MAX_TOKENS)
    for step, entry in enumerate(out.logprobs):
        for tid, lp in entry.items():
            assert lp.logprob == pytest.approx(ref[step][tid].item(), abs=1e-4)


def test_wrong_number_of_factors_is_refused() -> None:
    params = {"rope_type": "default", "rope_theta": 1e4, "freq_factors": [1.0] * 5}
    with pytest.raises(ValueError, match="rope_freqs has 5 factors; the rotary dimension needs 8"):
        compute_inv_freq(16, params, 1024)
