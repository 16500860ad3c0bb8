"""logit_bias, allowed_token_ids and bad_words (vLLM semantics) on the tiny model, and the
validation of the new SamplingParams fields."""

from __future__ import annotations

import pytest

from pagedllm import SamplingParams, StructuredOutputsParams


def _greedy(llm, prompt, n=12, **kw):
    p = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, **kw)
    return llm.generate([prompt], p, use_tqdm=False)[0].outputs[0].token_ids


def test_allowed_token_ids_only_those(llm):
    allowed = [40, 41, 300]
    for kw in ({}, {"temperature": 1.0, "seed": 4}):
        p = SamplingParams(max_tokens=30, ignore_eos=True, allowed_token_ids=allowed,
                           **{"temperature": 0.0, **kw})
        toks = llm.generate(["Hello"], p, use_tqdm=False)[0].outputs[0].token_ids
        assert set(toks) <= set(allowed) and len(toks) == 30


def test_logit_bias_forces_and_bans(llm):
    base = _greedy(llm, "The cat")
    assert _greedy(llm, "The cat", logit_bias={77: 100.0}) == [77] * 12
    banned = _greedy(llm, "The cat", logit_bias={base[0]: -100.0})
    assert banned[0] != base[0]


def test_bad_words_never_generated(llm):
    tok = llm.get_tokenizer()
    base = _greedy(llm, "The cat", n=20)
    # ban a single-token word and a two-token word taken from the free output
    word1 = tok.decode(base[:1])
    two = tok.decode(base[2:4])
    out = _greedy(llm, "The cat", n=20, bad_words=[word1, two])
    assert base[0] not in out[:1]
    ids2 = list(tok.encode(two.lstrip(), add_special_tokens=False))
    if len(ids2) > 1:
        for i in range(len(out) - len(ids2) + 1):
            assert out[i:i + len(ids2)] != ids2


def test_out_of_vocab_ids_rejected(llm):
    for kw, name in (({"logit_bias": {10**6: 1.0}}, "logit_bias"),
                     ({"allowed_token_ids": [10**6]}, "allowed_token_ids")):
        with pytest.raises(ValueError, match=name):
            llm.generate(["x"], SamplingParams(**kw), use_tqdm=False)


@pytest.mark.parametrize(("kw", "match"), [
    ({"logit_bias": {1: 101.0}}, "logit_bias"),
    ({"logit_bias": {"a": 1.0}}, "logit_bias"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"bad_words": [""]}, "bad_words"),
    ({"structured_outputs": {"json": {}}}, "structured_outputs"),
])
def test_sampling_params_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


@pytest.mark.parametrize(("kw", "match"), [
    ({}, "exactly one"),
    ({"json": {"type": "object"}, "regex": "a"}, "exactly one"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"json": [1]}, "schema object"),
    ({"choice": []}, "choice"),
    ({"choice": ["a", 3]}, "choice"),
    ({"regex": ""}, "regex"),
])
def test_structured_outputs_params_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        StructuredOutputsParams(**kw)


def test_structured_outputs_params_exported():
    import pagedllm
    import pagedllm.sampling_params

    assert pagedllm.StructuredOutputsParams is pagedllm.sampling_params.StructuredOutputsParams
    a = StructuredOutputsParams(json='{"b": 1, "a": 2}')
    b = StructuredOutputsParams(json={"a": 2, "b": 1})
    assert a.cache_key() == b.cache_key()
