"""Pooling requests through the step's messages, with runner outputs made by hand (no model):
`update_from_output` adds each chunk's PooledChunk to its request, finishes it with its last
chunk (blocks freed, full blocks kept in the prefix cache, reported in StepUpdate.pooled),
a chunk from position 0 starts the sum over; the output processor finalizes the vector."""

from __future__ import annotations

import pytest
import torch

from pagedllm.core.block_manager import BlockManager
from pagedllm.core.request import PooledChunkOrderError, Request, RequestStatus
from pagedllm.core.runner_output import PooledChunk, RunnerOutput
from pagedllm.core.scheduler import Scheduler
from pagedllm.engine.output_processor import OutputProcessor
from pagedllm.pooling.finalize import finalize
from pagedllm.pooling.setup import PoolingSetup
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams

BS = 4
PROMPT = list(range(10, 20))  # 10 tokens


def make(budget: int, caching: bool = True) -> tuple[Scheduler, BlockManager]:
    bm = BlockManager(32, BS, enable_caching=caching)
    return Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=64), bm


def pooling_request(rid: str, **params) -> Request:
    return Request(
        rid,
        PROMPT,
        SamplingParams(max_tokens=1),
        eos_token_id=None,
        pooling_params=PoolingParams(task="embed", **params),
    )


def run_step(sched: Scheduler, value: float = 1.0):
    """Schedule and apply a step whose MEAN parts are `value` per position."""
    out = sched.schedule()
    parts = [
        PooledChunk(
            s.request,
            s.request.num_computed_tokens,
            s.num_new_tokens,
            torch.full((3,), value * s.num_new_tokens),
        )
        for s in out.scheduled
    ]
    return out, sched.update_from_output(out, RunnerOutput(pooled=parts))


def test_chunks_sum_and_the_last_finishes_and_frees() -> None:
    sched, bm = make(budget=4)
    req = pooling_request("a")
    sched.add_request(req)
    for computed in (4, 8):
        _, update = run_step(sched)
        assert req.status is RequestStatus.RUNNING and not update.pooled
        assert req.num_pooled_positions == computed
    _, update = run_step(sched)
    assert update.pooled == [req] and req.status is RequestStatus.FINISHED_STOPPED
    assert torch.equal(req.pooled, torch.full((3,), 10.0))
    assert not sched.has_unfinished() and bm.num_free_blocks == bm.num_usable_blocks
    bm.check_invariants([])
    assert bm.prefix_cache is not None and bm.get_computed_blocks(pooling_request("b"))


def test_restart_from_position_zero_drops_the_old_sum() -> None:
    """MEAN pooling runs without prefix caching (the plan's rule): a recomputed request
    starts again at position 0, and a chunk that skips summed positions is a bug."""
    sched, bm = make(budget=4, caching=False)
    req = pooling_request("a")
    sched.add_request(req)
    run_step(sched, value=100.0)  # positions 0..3, then preempted by recompute
    assert sched.preempt(req) is False and req.num_computed_tokens == 0
    for _ in range(3):
        _, update = run_step(sched)
    assert update.pooled == [req] and torch.equal(req.pooled, torch.full((3,), 10.0))
    with pytest.raises(PooledChunkOrderError):
        req.add_pooled(4, 2, torch.ones(3))


def test_output_processor_finalizes_mean_and_normalizes() -> None:
    setup = PoolingSetup(
        task="embed",
        pooling_type="MEAN",
        normalize=True,
        activation=True,
        hidden_size=3,
        is_matryoshka=True,
    )
    proc = OutputProcessor(tokenizer=None, pooling=setup)
    sched, _ = make(budget=16)
    req = pooling_request("a", dimensions=2)
    proc.add(req)
    sched.add_request(req)
    _, update = run_step(sched, value=2.0)
    step = proc.process(update)
    assert step.touched == {"a"}
    out = proc.make_output("a")
    assert out.finished and out.prompt_token_ids == PROMPT
    assert torch.allclose(out.outputs.data, torch.tensor([0.5**0.5, 0.5**0.5]))
    raw = pooling_request("b", normalize=False)
    raw.add_pooled(0, 10, torch.full((3,), 20.0))
    assert torch.equal(finalize(setup, raw), torch.full((3,), 2.0))  # the mean, as is


def test_classifier_activation() -> None:
    setup = PoolingSetup(
        task="classify",
        pooling_type="LAST",
        normalize=False,
        activation=True,
        hidden_size=3,
        num_labels=2,
    )
    req = pooling_request("a")
    req.pooling_params = PoolingParams(task="classify")
    req.add_pooled(0, 10, torch.tensor([1.0, 3.0]))
    assert torch.allclose(finalize(setup, req), torch.softmax(torch.tensor([1.0, 3.0]), 0))
    req.pooling_params = PoolingParams(task="classify", activation=False)
    assert torch.equal(finalize(setup, req), torch.tensor([1.0, 3.0]))
    req.pooling_params = PoolingParams(task="score")
    req.add_pooled(0, 10, torch.tensor([0.5]))
    assert torch.allclose(finalize(setup, req), torch.sigmoid(torch.tensor([0.5])))


def test_all_pooling_appends_rows_in_order() -> None:
    req = pooling_request("a")
    assert not req.add_pooled(0, 4, torch.ones(4, 3))
    assert req.add_pooled(4, 6, torch.zeros(6, 3))
    assert req.pooled.shape == (10, 3) and req.pooled[:4].eq(1).all() and req.pooled[4:].eq(0).all()
    with pytest.raises(PooledChunkOrderError):
        req.add_pooled(2, 2, torch.ones(2, 3))
