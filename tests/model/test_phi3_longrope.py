"""Phi-3 / Phi-4 LongRoPE vs HF transformers (fp32, CPU).

A tiny Phi-3 with LongRoPE over a 32-token original length (max 128) and partial rotary
(0.75, as Phi-4-mini): its prompts of 1 ... 31 tokens cross 32 while generating and those of
48 and 75 start past it, so both factor sets and the switch between them are exercised. HF
picks the long factors for a forward call whose max(position_ids) + 1 exceeds 32; the engine
does so per sequence and step (model/layers/rotary.py), so greedy tokens match HF's when each
prompt is prefilled in one step. Frequencies are bit-identical to HF's.
"""

from __future__ import annotations

import random

import pytest
import torch

from pagedllm import SamplingParams
from pagedllm.model.layers.rope_scaling import compute_inv_freq, rope_parameters
from tests.model.family_checkpoints import make_family_checkpoint
from tests.model.test_vs_hf import MAX_TOKENS, PROMPTS, assert_matches_hf

rng = random.Random(3)
SHORT = [round(1.0 + rng.random() * 0.5, 3) for _ in range(6)]
LONG = [round(2.0 + rng.random() * 6.0, 3) for _ in range(6)]
LONGROPE = dict(
    max_position_embeddings=128,
    original_max_position_embeddings=32,
    partial_rotary_factor=0.75,
    rope_parameters={
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": SHORT,
        "long_factor": LONG,
    },
)


@pytest.fixture(scope="module")
def longrope_dir(tmp_path_factory, tiny_tokenizer):
    return make_family_checkpoint(
        tmp_path_factory.mktemp("phi3_longrope"),
        "phi3",
        tiny_tokenizer,
        seed=21,
        **LONGROPE,
    )


@pytest.mark.parametrize("seq_len", [None, 32, 33, 100])
def test_inv_freq_bit_identical_to_hf(seq_len) -> None:
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.Phi3Config(hidden_size=64, num_attention_heads=4, **LONGROPE)
    want, want_scale = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=seq_len)
    params = rope_parameters(config)
    got, scale = compute_inv_freq(12, params, 128, seq_len)
    assert torch.equal(got, want) and scale == want_scale
    assert scale > 1.0  # factor 4: sqrt(1 + ln 4 / ln 32)


def test_longrope_greedy_matches_hf(longrope_dir, make_llm, hf_reference) -> None:
    llm = make_llm(longrope_dir)
    assert llm.llm_engine.model.model.rotary.is_dynamic
    assert_matches_hf(llm, longrope_dir, hf_reference, PROMPTS)


def test_longrope_logprobs_within_1e4_of_hf(longrope_dir, make_llm, hf_reference) -> None:
    llm = make_llm(longrope_dir)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    for prompt in (PROMPTS[4], PROMPTS[7]):  # crosses 32 while decoding; starts past it
        out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0].outputs[0]
        expected, ref = hf_reference.greedy(longrope_dir, prompt, MAX_TOKENS)
        assert out.token_ids == expected
        for step, entry in enumerate(out.logprobs):
            for tid, lp in entry.items():
                assert lp.logprob == pytest.approx(ref[step][tid].item(), abs=1e-4)


def test_longrope_turns_prefix_caching_off(longrope_dir, make_llm) -> None:
    llm = make_llm(longrope_dir)
    assert not llm.llm_engine.plan.prefix_caching


def test_longrope_factors_of_the_wrong_length_are_refused() -> None:
    params = {
        "rope_type": "longrope",
        "rope_theta": 1e4,
        "short_factor": [1.0] * 5,
        "long_factor": [1.0] * 5,
        "original_max_position_embeddings": 32,
    }
    with pytest.raises(ValueError, match="rotary_dim / 2 = 6 entries; got 5"):
        compute_inv_freq(12, params, 128)
