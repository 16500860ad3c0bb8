"""Gemma 3 and Qwen3 vs HF transformers on tiny random checkpoints (fp32, CPU).

Gemma 3's tiny model has a window of 16 on 3 of its 4 layers, so the longer prompts
(48, 75 and 150 tokens) span several windows; greedy tokens must equal HF's with chunked
prefill, several block sizes, preemption and prefix caching.
"""

from __future__ import annotations

import random

import pytest

from pagedllm import SamplingParams
from tests.model.test_vs_hf import (
    KV_BYTES_PER_TOKEN,
    PROMPTS,
    assert_matches_hf,
    record_schedules,
)

LONG = [random.Random(7).randrange(2, 512) for _ in range(150)]
GEMMA_PROMPTS = [*PROMPTS[:7], LONG]   # 8 prompts: 1 ... 48 tokens and 150 (9+ windows)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_greedy_batch_matches_hf(arch, request, make_llm, hf_reference) -> None:
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    llm = make_llm(model_dir)
    assert_matches_hf(llm, model_dir, hf_reference, GEMMA_PROMPTS)


def test_gemma3_windows_are_per_layer(tiny_gemma3_dir, make_llm) -> None:
    llm = make_llm(tiny_gemma3_dir)
    groups = llm.llm_engine.kv_spec.groups.groups
    assert groups[0].window is None  # group 0 (the metadata's default) is full attention
    windows = [layer.self_attn.window for layer in llm.llm_engine.model.model.layers]
    assert windows == [16, 16, None, 16]


@pytest.mark.parametrize("block_size", [8, 32])
@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_block_sizes_and_chunked_prefill(arch, block_size, request, make_llm,
                                         hf_reference) -> None:
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    llm = make_llm(model_dir, block_size=block_size, max_num_batched_tokens=24)
    steps = record_schedules(llm)
    assert_matches_hf(llm, model_dir, hf_reference, GEMMA_PROMPTS)
    assert max(sum(p.num_new_tokens for p in step) for step in steps) == 24


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
def test_preemption(arch, request, make_llm, hf_reference) -> None:
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    # Both tiny models store 512 bytes per token (layers x kv heads = 4, head_dim 16, fp32);
    # Gemma 3's blocks hold one layer of one KV group (core/kv_groups.py): 4x the blocks,
    # and its sliding groups keep only their window's.
    llm = make_llm(model_dir, block_size=8, max_model_len=192, max_num_batched_tokens=32,
                   kv_cache_memory=26 * 8 * KV_BYTES_PER_TOKEN)
    assert llm.llm_engine.num_blocks == {"qwen3": 26, "gemma3": 104}[arch]
    assert_matches_hf(llm, model_dir, hf_reference, GEMMA_PROMPTS)
    assert llm.llm_engine.stats.num_preemptions_total > 0


def test_gemma3_prefix_caching(tiny_gemma3_dir, make_llm, hf_reference) -> None:
    """Prompts sharing a 3-window prefix, then the same prompts again: cache hits, HF's
    tokens every time."""
    llm = make_llm(tiny_gemma3_dir, block_size=8, max_num_batched_tokens=32)
    prompts = [LONG[:48 + extra] + [3 + extra] for extra in (0, 5, 17, 40)]
    for _ in range(2):
        assert_matches_hf(llm, tiny_gemma3_dir, hf_reference, prompts)
    assert llm.llm_engine.stats.prefix_cache_hits >= 3 * 48


def _hf_with_attention_softcapping(model_dir):
    """HF's Gemma 3 (5.x) never passes `attn_logit_softcapping` to its attention; this
    reference runs HF's eager attention with the config's softcap (as Gemma 2 does)."""
    import torch
    import transformers
    import transformers.masking_utils
    from transformers.models.gemma3 import modeling_gemma3

    def softcapped(module, *args, **kwargs):
        kwargs.pop("softcap", None)
        return modeling_gemma3.eager_attention_forward(
            module, *args, softcap=module.attn_logit_softcapping, **kwargs)

    transformers.AttentionInterface.register("softcap_eager", softcapped)
    transformers.AttentionMaskInterface.register(
        "softcap_eager", transformers.masking_utils.ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    return transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="softcap_eager")


def test_gemma3_softcapping(tmp_path, tiny_tokenizer, make_llm, hf_reference) -> None:
    """attn_logit_softcapping and final_logit_softcapping (Gemma 2 style configs)."""
    from tests.conftest import GEMMA3_LAYER_TYPES, make_tiny_checkpoint

    model_dir = make_tiny_checkpoint(
        tmp_path, "gemma3", tiny_tokenizer, seed=5, head_dim=16, num_hidden_layers=4,
        num_key_value_heads=2, layer_types=GEMMA3_LAYER_TYPES, sliding_window=16,
        query_pre_attn_scalar=16, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
        norm_jitter=0.3, weight_scale=2.0, pad_token_id=0)
    hf_reference.register(model_dir, _hf_with_attention_softcapping(model_dir))
    llm = make_llm(model_dir, max_num_batched_tokens=32)
    assert_matches_hf(llm, model_dir, hf_reference, GEMMA_PROMPTS[3:])
    out = llm.generate({"prompt_token_ids": LONG}, SamplingParams(
        temperature=0.0, max_tokens=1, logprobs=3), use_tqdm=False)[0].outputs[0]
    _, ref = hf_reference.greedy(model_dir, LONG, 1)
    for tid, lp in out.logprobs[0].items():
        assert lp.logprob == pytest.approx(ref[0][tid].item(), abs=1e-4)
