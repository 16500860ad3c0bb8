"""The whole CUDA forward path on CPU: PAGEDLLM_ATTENTION_BACKEND=triton runs the Triton
kernels (varlen paged attention, KV writes, fused norms and RoPE) in Triton's interpreter,
and greedy tokens must equal HF's, with chunked prefill (chunks attend to cached context),
Qwen2's biases / tied embeddings, Gemma 3's per-layer windows and (1 + w) norms, and an
int8 KV cache (its tokens must equal the CPU path's on the same 8-bit cache)."""

from __future__ import annotations

import pytest

from pagedllm import SamplingParams

PROMPTS = [[3, 8, 1, 9], list(range(2, 23))]  # the second: a chunk after cached context
MAX_TOKENS = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


def _generate(llm):
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_triton_path_matches_hf(arch, monkeypatch, request, make_llm, hf_reference):
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "triton")
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    llm = make_llm(model_dir, block_size=8, max_num_batched_tokens=16)
    got = _generate(llm)
    for prompt, tokens in zip(PROMPTS, got, strict=True):
        assert tokens == hf_reference.greedy(model_dir, prompt, MAX_TOKENS)[0]
    engine = llm.llm_engine
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks


def test_triton_path_int8_cache_matches_cpu_path(monkeypatch, tiny_llama_dir, make_llm):
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "torch")
    expected = _generate(make_llm(tiny_llama_dir, kv_cache_dtype="int8"))
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "triton")
    assert _generate(make_llm(tiny_llama_dir, kv_cache_dtype="int8")) == expected
