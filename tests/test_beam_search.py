"""`BeamSearchInstance` (pagedllm/beam_search.py) on hand-made logprobs: HF's rules for which
candidates finish, which run on, and when the search ends (the model-level equality with HF
is tests/engine/test_llm_beam_search.py)."""

from __future__ import annotations

import math

import pytest

from pagedllm.beam_search import (
    BeamSearchInstance,
    BeamSearchParams,
    BeamSearchStateError,
)
from pagedllm.outputs import Logprob

EOS = 9


def row(**probs: float) -> dict[int, Logprob]:
    """{token: Logprob} from t<id>=probability keywords."""
    return {int(k[1:]): Logprob(math.log(v)) for k, v in probs.items()}


def test_first_step_ranks_candidates_and_eos_below_rank_k_is_dropped():
    inst = BeamSearchInstance([1, 2], BeamSearchParams(beam_width=2, max_tokens=5), EOS)
    inst.advance([row(t3=0.5, t4=0.3, t9=0.1, t5=0.05)])  # EOS ranks 3rd (>= k): dropped
    assert [b.tokens for b in inst.beams] == [[1, 2, 3], [1, 2, 4]]
    assert inst.completed == [] and not inst.done
    # EOS at rank 0 finishes (score / 2 tokens); the two best others run on
    inst.advance([row(t9=0.9, t6=0.05), row(t7=0.5, t8=0.4)])
    (fin,) = inst.completed
    assert fin.tokens == [1, 2, 3, 9] and fin.finish_reason == "stop"
    assert fin.score == pytest.approx(math.log(0.5 * 0.9) / 2)
    assert [b.tokens[-1] for b in inst.beams] == [7, 8]


def test_early_stopping_true_ends_once_k_hypotheses_finished():
    params = BeamSearchParams(beam_width=1, max_tokens=10, early_stopping=True)
    inst = BeamSearchInstance([1], params, EOS)
    inst.advance([row(t9=0.6, t3=0.4)])
    assert inst.done and [s.tokens for s in inst.output().sequences] == [[1, 9]]


def test_heuristic_keeps_going_while_a_running_beam_can_still_win():
    # length_penalty 0: scores are cum logprobs, which only fall: once the best running
    # beam is below the worst finished one, the search ends (early_stopping False)
    params = BeamSearchParams(beam_width=1, max_tokens=10, length_penalty=0.0)
    inst = BeamSearchInstance([1], params, EOS)
    inst.advance([row(t9=0.6, t3=0.4)])
    assert inst.done  # 0.4 < 0.6: nothing can beat the finished hypothesis
    inst = BeamSearchInstance([1], params, EOS)
    inst.advance([row(t3=0.6, t9=0.4)])
    assert not inst.done and inst.completed == []  # EOS at rank 1 >= k: dropped


def test_max_tokens_finishes_the_top_k_as_length():
    inst = BeamSearchInstance([1], BeamSearchParams(beam_width=2, max_tokens=1), EOS)
    inst.advance([row(t3=0.5, t4=0.3, t5=0.2)])
    out = inst.output().sequences
    assert inst.done and [s.tokens for s in out] == [[1, 3], [1, 4]]
    assert [s.finish_reason for s in out] == ["length", "length"]


def test_ignore_eos_treats_eos_as_a_token():
    params = BeamSearchParams(beam_width=1, max_tokens=3, ignore_eos=True)
    inst = BeamSearchInstance([1], params, EOS)
    inst.advance([row(t9=0.9, t3=0.1)])
    assert not inst.done and inst.beams[0].tokens == [1, 9]


def test_misuse_is_an_invariant_error():
    inst = BeamSearchInstance([1], BeamSearchParams(beam_width=2, max_tokens=1), EOS)
    with pytest.raises(BeamSearchStateError, match="2 logprobs rows for 1 beams"):
        inst.advance([row(t3=0.5), row(t4=0.5)])
    inst.advance([row(t3=0.5, t4=0.5)])
    with pytest.raises(BeamSearchStateError, match="finished beam search"):
        inst.advance([row(t3=1.0)])
