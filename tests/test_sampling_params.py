from __future__ import annotations

import pytest

from pagedllm.sampling_params import MAX_LOGPROBS, MAX_N, SamplingParams, SamplingType


def test_defaults_match_vllm() -> None:
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.min_p) == (1, 1.0, 1.0, 0, 0.0)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.seed is None and p.max_tokens == 16 and p.min_tokens == 0
    assert p.stop == [] and p.stop_token_ids == [] and p.logprobs is None
    assert not p.ignore_eos and not p.include_stop_str_in_output
    assert p.skip_special_tokens and p.spaces_between_special_tokens
    assert p.sampling_type is SamplingType.RANDOM and not p.is_greedy


@pytest.mark.parametrize(
    ("kwargs", "fragments"),
    [
        ({"n": 0}, ["n must be in [1, 128]", "got 0"]),
        ({"n": MAX_N + 1}, ["n must be in [1, 128]", "got 129"]),
        ({"n": 1.5}, ["n must be an int", "1.5"]),
        ({"temperature": -1.0}, ["temperature must be >= 0", "got -1.0"]),
        ({"top_p": 1.5}, ["top_p must be in (0, 1]", "got 1.5"]),
        ({"top_p": 0.0}, ["top_p must be in (0, 1]", "got 0.0"]),
        ({"top_k": -2}, ["top_k must be", "-1 (disable)", ">= 1", "got -2"]),
        ({"min_p": 1.1}, ["min_p must be in [0, 1]", "got 1.1"]),
        ({"min_p": -0.1}, ["min_p must be in [0, 1]", "got -0.1"]),
        ({"presence_penalty": 2.5}, ["presence_penalty must be in [-2, 2]", "got 2.5"]),
        ({"frequency_penalty": -3.0}, ["frequency_penalty must be in [-2, 2]", "got -3.0"]),
        ({"repetition_penalty": 0.0}, ["repetition_penalty must be > 0", "got 0.0"]),
        ({"seed": 1.0}, ["seed must be an int", "1.0"]),
        ({"seed": True}, ["seed must be an int", "True"]),
        ({"max_tokens": 0}, ["max_tokens must be >= 1", "got 0"]),
        ({"min_tokens": -1}, ["min_tokens must be >= 0", "got -1"]),
        ({"min_tokens": 5, "max_tokens": 4}, ["min_tokens must be <= max_tokens (4)", "got 5"]),
        ({"logprobs": -1}, ["logprobs must be >= 0", "got -1"]),
        ({"stop": ""}, ["stop strings must be non-empty", "''"]),
        ({"stop": ["ok", ""]}, ["stop strings must be non-empty"]),
        ({"stop_token_ids": [-3]}, ["stop_token_ids entries must be >= 0", "got -3"]),
    ],
)
def test_validation_errors(kwargs: dict, fragments: list[str]) -> None:
    with pytest.raises(ValueError) as exc:
        SamplingParams(**kwargs)
    for fragment in fragments:
        assert fragment in str(exc.value)


def test_boundaries_are_accepted() -> None:
    SamplingParams(top_p=1.0, min_p=1.0, presence_penalty=-2.0, frequency_penalty=2.0)
    SamplingParams(logprobs=0)
    SamplingParams(logprobs=MAX_LOGPROBS, min_tokens=16, max_tokens=16)
    SamplingParams(max_tokens=None, min_tokens=1000)
    SamplingParams(top_k=1, temperature=0.0)


def test_normalisation() -> None:
    p = SamplingParams(stop="###", stop_token_ids=(5, 6), top_k=-1)
    assert p.stop == ["###"] and p.stop_token_ids == [5, 6] and p.top_k == 0


def test_greedy_resets_truncation() -> None:
    p = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2, seed=7)
    assert p.is_greedy and p.sampling_type is SamplingType.GREEDY
    assert (p.top_p, p.top_k, p.min_p) == (1.0, 0, 0.0)
    assert SamplingParams(temperature=1e-6).is_greedy
    assert SamplingParams(seed=7).sampling_type is SamplingType.RANDOM_SEED


def test_clone_is_deep() -> None:
    p = SamplingParams(stop=["a"], stop_token_ids=[1])
    q = p.clone()
    assert q == p
    q.stop.append("b")
    q.stop_token_ids.append(2)
    assert p.stop == ["a"] and p.stop_token_ids == [1]
