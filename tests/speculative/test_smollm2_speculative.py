"""SmolLM2-135M-Instruct (real, GGUF): greedy output identical with n-gram speculation on 4
prompts, two of them asking to copy text (so drafts are accepted)."""

from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.loader import ModelNotFoundError, default_model_path

pytestmark = pytest.mark.slow

PARAGRAPH = ("The quick brown fox jumps over the lazy dog. The dog, annoyed, gets up and "
             "walks to the other side of the garden, where the sun is warm.")
PROMPTS = [
    f"Repeat this text exactly: {PARAGRAPH}\nRepeated text: {PARAGRAPH[:40]}",
    "def add(a, b):\n    return a + b\n\n\ndef add_three(a, b, c):\n    return",
    "The capital of France is",
    "Once upon a time, in a small village,",
]


def test_greedy_identical_with_ngram():
    try:
        default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    common = dict(kv_cache_memory=64 * 2**20, max_model_len=512, num_threads=1)
    sp = SamplingParams(temperature=0, max_tokens=48)
    want = LLM(**common).generate(PROMPTS, sp, use_tqdm=False)
    spec = LLM(**common, speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    got = spec.generate(PROMPTS, sp, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    sd = spec.llm_engine.stats.speculative
    assert sd.num_accepted_tokens > 10, sd
    spec.llm_engine.check_idle()
