"""The real default model (SmolLM2-135M-Instruct, GGUF Q4_1) against HF transformers.

The HF reference loads the plain HF directory pagedllm's GGUF loader caches (float32
safetensors; tests/loader prove those weights equal transformers' own GGUF conversion),
which takes ~1 s instead of ~40 s for `from_pretrained(..., gguf_file=...)`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from pagedllm import LLM, SamplingParams
from pagedllm.loader import ModelNotFoundError, default_model_path, hf_reference_dir

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
]
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def llm() -> LLM:
    try:
        default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    # One thread (process-wide, so HF's reference too): on a shared 2-core machine two
    # threads contend with other processes and run ~5x slower than one.
    # The exact path (int8 activations are the default on VNNI CPUs): HF's numerics.
    return LLM(kv_cache_memory=64 * 2**20, max_model_len=512, num_threads=1,
               int8_activations=False)


@pytest.fixture(scope="module")
def hf_dir(llm, hf_reference) -> Path:
    """An HF directory of the GGUF's dequantized weights (the dense conversion cache entry;
    the engine itself runs the weights quantized)."""
    gguf = default_model_path()
    entry = hf_reference_dir(str(gguf))
    if (entry / "model.safetensors").is_file():
        return entry
    # The cache could not be written: let transformers convert the GGUF itself (~40 s).
    hf_reference.register(gguf, transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32))
    return gguf


@pytest.fixture(scope="module")
def greedy_outputs(llm):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    return llm.generate(PROMPTS, params, use_tqdm=False)


def test_greedy_tokens_match_hf(greedy_outputs, hf_dir, hf_reference) -> None:
    for out in greedy_outputs:
        expected, _ = hf_reference.greedy(hf_dir, out.prompt_token_ids, MAX_TOKENS)
        assert out.outputs[0].token_ids == expected, out.prompt


def test_top_logprobs_match_hf(greedy_outputs, hf_dir, hf_reference) -> None:
    for out in greedy_outputs:
        _, ref = hf_reference.greedy(hf_dir, out.prompt_token_ids, MAX_TOKENS)
        for step, entry in enumerate(out.outputs[0].logprobs):
            for token, lp in entry.items():
                assert lp.logprob == pytest.approx(ref[step, token].item(), abs=1e-3), (
                    out.prompt, step, token)
            top = ref[step].topk(5).indices.tolist()
            assert sorted(entry, key=lambda t: entry[t].rank) == top, (out.prompt, step)


def test_chat_knows_the_capital_of_france(llm) -> None:
    (out,) = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                      SamplingParams(temperature=0, max_tokens=32), use_tqdm=False)
    assert "Paris" in out.outputs[0].text
    engine = llm.llm_engine
    assert engine.block_manager.num_free_blocks == engine.num_blocks
