"""core/stop_checks.py: stop tokens after min_tokens, EOS vs ignore_eos, finished grammars,
max_tokens and max_model_len, in vLLM's order."""

from __future__ import annotations

import pytest

from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.stop_checks import is_stop_token, stop_status
from pagedllm.sampling_params import SamplingParams

EOS = 2


def after(tokens: list[int], max_tokens: int = 10, **params) -> Request:
    req = Request("r", [5, 6], SamplingParams(max_tokens=max_tokens, **params),
                  eos_token_id=EOS)
    for t in tokens:
        req.append_token(t)
    return req


@pytest.mark.parametrize(("params", "tokens", "want"), [
    ({}, [EOS], (RequestStatus.FINISHED_STOPPED, None)),
    ({"ignore_eos": True}, [EOS], None),
    ({"stop_token_ids": [9]}, [9], (RequestStatus.FINISHED_STOPPED, 9)),
    ({"min_tokens": 2}, [EOS], None),                      # too early
    ({"min_tokens": 2}, [4, EOS], (RequestStatus.FINISHED_STOPPED, None)),
    ({"max_tokens": 2}, [4, 4], (RequestStatus.FINISHED_LENGTH, None)),
    ({"max_tokens": 2}, [4, EOS], (RequestStatus.FINISHED_STOPPED, None)),  # stop beats length
    ({}, [4], None),
])
def test_stop_status(params, tokens, want) -> None:
    req = after(tokens, **params)
    assert stop_status(req, tokens[-1], max_model_len=100) == want


def test_max_model_len_and_finished_grammar() -> None:
    assert stop_status(after([4]), 4, max_model_len=3) == (RequestStatus.FINISHED_LENGTH, None)

    class Done:
        is_terminated = True

        def accept(self, _token: int) -> None:
            pass

    req = after([4])
    req.grammar = Done()
    assert stop_status(req, 4, max_model_len=100) == (RequestStatus.FINISHED_STOPPED, None)


def test_is_stop_token_counts_the_output_position() -> None:
    req = after([], min_tokens=3)
    assert not is_stop_token(req, EOS, num_output_tokens=2)
    assert is_stop_token(req, EOS, num_output_tokens=3)
    assert not is_stop_token(req, 4, num_output_tokens=3)
