"""Beam search on the real default model (SmolLM2-135M-Instruct, GGUF Q4_1) against HF
`generate(num_beams=4, do_sample=False)` on the same (dequantized) weights: every returned
beam's tokens and order, and the length-penalized scores (1e-3)."""

from __future__ import annotations

import pytest
import torch
import transformers

from pagedllm import LLM, BeamSearchParams
from pagedllm.loader import ModelNotFoundError, default_model_path, hf_reference_dir

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "The three primary colors are"]
BEAMS, MAX_TOKENS = 4, 16


@pytest.fixture(scope="module")
def llm() -> LLM:
    try:
        default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    return LLM(kv_cache_memory=64 * 2**20, max_model_len=512, num_threads=1, int8_activations=False)


@pytest.fixture(scope="module")
def hf_model(llm):
    gguf = default_model_path()
    entry = hf_reference_dir(str(gguf))
    if (entry / "model.safetensors").is_file():
        return transformers.AutoModelForCausalLM.from_pretrained(entry, dtype=torch.float32)
    return transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )


@pytest.mark.parametrize("length_penalty", [1.0, 0.0])
def test_beams_equal_hf(llm, hf_model, length_penalty):
    tok = llm.get_tokenizer()
    eos = llm.llm_engine.eos_token_id
    params = BeamSearchParams(
        beam_width=BEAMS, max_tokens=MAX_TOKENS, length_penalty=length_penalty
    )
    outs = llm.beam_search(PROMPTS, params)
    for text, out in zip(PROMPTS, outs, strict=True):
        prompt = tok.encode(text)
        ref = hf_model.generate(
            torch.tensor([prompt]),
            num_beams=BEAMS,
            do_sample=False,
            num_return_sequences=BEAMS,
            max_new_tokens=MAX_TOKENS,
            length_penalty=length_penalty,
            return_dict_in_generate=True,
            output_scores=True,
            eos_token_id=eos,
            pad_token_id=eos,
        )
        want = []
        for seq in ref.sequences[:, len(prompt) :].tolist():
            want.append(seq[: seq.index(eos) + 1] if eos in seq else seq)
        assert [s.tokens[len(prompt) :] for s in out.sequences] == want, text
        assert [s.score for s in out.sequences] == pytest.approx(
            ref.sequences_scores.tolist(), abs=1e-3
        )
    engine = llm.llm_engine
    assert engine.block_manager.num_free_blocks == engine.num_blocks
    engine.check_idle()
