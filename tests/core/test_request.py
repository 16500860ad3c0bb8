"""`Request`: appending tokens (logprobs, time stamps, grammar), truncating a speculative run
at a stop string, and forking n > 1 siblings."""

from __future__ import annotations

from pagedllm.core.request import Request, RequestStatus
from pagedllm.outputs import Logprob
from pagedllm.sampling_params import SamplingParams


class CountingGrammar:
    def __init__(self) -> None:
        self.accepted: list[int] = []

    def accept(self, token_id: int) -> None:
        self.accepted.append(token_id)

    def fork(self) -> CountingGrammar:
        twin = CountingGrammar()
        twin.accepted = list(self.accepted)
        return twin


def make(**params) -> Request:
    return Request("r", [1, 2, 3], SamplingParams(**params), eos_token_id=0)


def test_construction_takes_what_the_intake_resolved() -> None:
    grammar = CountingGrammar()
    req = Request("r", [1, 2], SamplingParams(max_tokens=None, n=2), eos_token_id=0,
                  grammar=grammar, max_tokens=30, generators=[None, None])
    assert req.grammar is grammar and req.max_tokens == 30 and req.generators == [None, None]
    assert make(max_tokens=5).max_tokens == 5
    assert req.status == RequestStatus.WAITING and req.num_tokens == 2


def test_append_token_records_logprobs_times_and_the_grammar() -> None:
    req = make(logprobs=1)
    req.grammar = CountingGrammar()
    req.append_token(7, {7: Logprob(-0.5, 1)}, now=10.0)
    req.append_token(8, {8: Logprob(-1.5, 2), 7: Logprob(-0.1, 1)}, now=11.0)
    assert req.output_token_ids == [7, 8] and req.all_token_ids == [1, 2, 3, 7, 8]
    assert req.cumulative_logprob == -2.0 and len(req.logprobs) == 2
    assert (req.times.first_token, req.times.last_token) == (10.0, 11.0)
    assert req.grammar.accepted == [7, 8]


def test_truncate_output_drops_tokens_and_their_logprobs() -> None:
    req = make(logprobs=0)
    for tok, lp in ((7, -1.0), (8, -2.0), (9, -4.0)):
        req.append_token(tok, {tok: Logprob(lp, 1)})
    req.truncate_output(1)
    assert req.output_token_ids == [7] and req.all_token_ids == [1, 2, 3, 7]
    assert req.cumulative_logprob == -1.0 and len(req.logprobs) == 1
    req.truncate_output(5)  # nothing past the end to drop
    assert req.output_token_ids == [7]


def test_fork_copies_progress_and_keeps_its_own_generator() -> None:
    req = make(n=2, logprobs=0)
    req.grammar = CountingGrammar()
    req.generators = ["g0", "g1"]
    req.append_token(7, {7: Logprob(-1.0, 1)})
    req.num_computed_tokens = 3
    child = req.fork("r-1", 1)
    assert child.group_id == "r" and child.index == 1 and child.forked
    assert child.output_token_ids == [7] and child.num_computed_tokens == 3
    assert child.generators == ["g1"] and child.grammar is not req.grammar
    child.append_token(9, {9: Logprob(-2.0, 1)})
    assert req.output_token_ids == [7] and req.cumulative_logprob == -1.0  # nothing shared
