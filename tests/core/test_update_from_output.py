"""`Scheduler.update_from_output` driven with runner outputs made by hand (no model): each
way a step's result changes a request — tokens, logprobs, fan-out, stop tokens, length,
grammar-free stops, accepted drafts and their slots, errors — and `apply_stop_strings`."""

from __future__ import annotations

import pytest

from pagedllm.core.block_manager import BlockManager
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.runner_output import RunnerOutput, SampledTokens
from pagedllm.core.scheduler import Scheduler
from pagedllm.core.scheduler_output import StopStringHit
from pagedllm.outputs import Logprob
from pagedllm.sampling_params import SamplingParams

BS = 4
EOS = 2


def make(num_blocks: int = 32, max_model_len: int = 64) -> tuple[Scheduler, BlockManager]:
    bm = BlockManager(num_blocks, BS)
    return Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=64,
                     max_model_len=max_model_len), bm


def add(sched: Scheduler, rid: str, prompt_len: int = 6, **params) -> Request:
    p = SamplingParams(**{"max_tokens": 8, **params})
    req = Request(rid, list(range(10, 10 + prompt_len)), p, eos_token_id=EOS)
    req.max_tokens = p.max_tokens
    sched.add_request(req)
    return req


def prefill(sched: Scheduler, req: Request, tokens: list[int]):
    out = sched.schedule()
    return out, sched.update_from_output(out, RunnerOutput([SampledTokens(req, tokens)]))


def test_tokens_are_appended_and_the_prompt_counts_as_computed() -> None:
    sched, bm = make()
    req = add(sched, "a", logprobs=1)
    entry = {5: Logprob(-0.5, 1), 6: Logprob(-1.0, 2)}
    out = sched.schedule()
    update = sched.update_from_output(out, RunnerOutput([SampledTokens(req, [5], [entry])]))
    assert update.appended == {req: 1} and update.num_tokens == 1
    assert req.output_token_ids == [5] and req.num_computed_tokens == 6
    assert req.logprobs == [entry] and req.cumulative_logprob == -0.5
    assert req.times.first_token is not None and req.status == RequestStatus.RUNNING
    bm.check_invariants([req])


def test_a_chunk_that_does_not_reach_the_end_samples_nothing() -> None:
    sched, _ = make()
    sched.max_num_batched_tokens = 4
    req = add(sched, "a", prompt_len=6)
    out = sched.schedule()
    assert not out.scheduled[0].samples
    update = sched.update_from_output(out, RunnerOutput())
    assert req.num_computed_tokens == 4 and not update.appended


@pytest.mark.parametrize(("kwargs", "token", "status", "reason"), [
    ({}, EOS, RequestStatus.FINISHED_STOPPED, None),
    ({"stop_token_ids": [9]}, 9, RequestStatus.FINISHED_STOPPED, 9),
    ({"ignore_eos": True}, EOS, None, None),
    ({"min_tokens": 2}, EOS, None, None),
    ({"max_tokens": 1}, 5, RequestStatus.FINISHED_LENGTH, None),
])
def test_stop_tokens_and_length_finish_and_free(kwargs, token, status, reason) -> None:
    sched, bm = make()
    req = add(sched, "a", **kwargs)
    prefill(sched, req, [token])
    assert (req.status if req.is_finished else None) == status
    assert req.stop_reason == reason
    assert (req.block_ids == []) == (status is not None)
    assert req in sched.running or status is not None
    bm.check_invariants([req] if status is None else [])


def test_max_model_len_finishes_with_length() -> None:
    sched, _ = make(max_model_len=7)
    req = add(sched, "a", prompt_len=6, max_tokens=None)
    req.max_tokens = 50
    prefill(sched, req, [5])
    assert req.status == RequestStatus.FINISHED_LENGTH


def test_n_samples_fan_out_into_siblings_sharing_blocks() -> None:
    sched, bm = make()
    req = add(sched, "g", n=3)
    _, update = prefill(sched, req, [5, 6, 7])
    kids = update.forked
    assert [k.request_id for k in kids] == ["g-1", "g-2"] and req.forked
    assert [s.output_token_ids for s in (req, *kids)] == [[5], [6], [7]]
    assert all(k.block_ids == req.block_ids for k in kids)
    assert sched.running == [req, *kids]
    bm.check_invariants([req, *kids])


def test_an_error_is_reported_and_nothing_is_appended() -> None:
    sched, _ = make()
    req = add(sched, "a")
    out = sched.schedule()
    update = sched.update_from_output(
        out, RunnerOutput([SampledTokens(req, [5], error="logits are NaN")]))
    assert update.errors == {"a": "logits are NaN"} and not update.appended
    assert req.output_token_ids == [] and not req.is_finished


def decode_with_drafts(drafts: list[int], accepted: list[int], **params):
    """A request decoding with `drafts` proposed; the runner accepts a prefix of them."""
    sched, bm = make()
    req = add(sched, "a", prompt_len=7, **params)
    prefill(sched, req, [5])                 # 8 tokens, 7 computed: 2 blocks
    sched.set_draft_tokens([(req, drafts)])
    out = sched.schedule()
    assert out.scheduled[0].num_draft_tokens == len(drafts)
    assert len(req.block_ids) == 3           # the drafts' slots reach into a third block
    tokens = accepted + [40]                 # the accepted drafts, then one sampled token
    update = sched.update_from_output(out, RunnerOutput([SampledTokens(
        req, tokens, num_drafts=len(drafts), num_accepted=len(accepted))]))
    return sched, bm, req, update


def test_accepted_drafts_are_committed_and_rejected_slots_given_back() -> None:
    sched, bm, req, update = decode_with_drafts([30, 31, 32, 33], [30])
    assert req.output_token_ids == [5, 30, 40] and update.appended == {req: 2}
    assert req.num_computed_tokens == 9      # 8 + the accepted draft; 40 is not computed
    assert len(req.block_ids) == 3 and req.draft_token_ids == []
    bm.check_invariants([req])
    sched2, bm2, req2, _ = decode_with_drafts([30, 31, 32, 33], [])
    assert req2.num_computed_tokens == 8 and len(req2.block_ids) == 3  # 9 tokens: 3 blocks
    bm2.check_invariants([req2])


def test_a_stop_token_inside_the_accepted_run_drops_the_rest() -> None:
    _, bm, req, update = decode_with_drafts([30, EOS, 32], [30, EOS])
    assert req.output_token_ids == [5, 30, EOS] and update.appended == {req: 2}
    assert req.status == RequestStatus.FINISHED_STOPPED and req.block_ids == []
    bm.check_invariants([])


def test_stop_strings_truncate_and_override_a_length_stop() -> None:
    sched, bm, req, update = decode_with_drafts([30, 31, 32], [30, 31])
    assert req.num_output_tokens == 4
    sched.apply_stop_strings([StopStringHit(req, "xy", 2)], update)
    assert req.output_token_ids == [5, 30] and update.appended == {req: 1}
    assert req.status == RequestStatus.FINISHED_STOPPED and req.stop_reason == "xy"
    assert req.block_ids == [] and req not in sched.running
    sched, _ = make()
    req = add(sched, "b", max_tokens=1)
    _, update = prefill(sched, req, [5])
    assert req.status == RequestStatus.FINISHED_LENGTH
    sched.apply_stop_strings([StopStringHit(req, "stop", 1)], update)
    assert req.status == RequestStatus.FINISHED_STOPPED and req.stop_reason == "stop"


def test_preemption_clears_drafts() -> None:
    sched, _ = make()
    req = add(sched, "a")
    prefill(sched, req, [5])
    sched.set_draft_tokens([(req, [1, 2])])
    sched.preempt(req)
    assert req.draft_token_ids == [] and req.status == RequestStatus.WAITING
