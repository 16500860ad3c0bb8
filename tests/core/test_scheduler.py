"""Scheduler unit tests with no model: synthetic requests and a fake runner that appends a
token to every request whose scheduled chunk reaches its last known token.

Every step checks the token budget, max_num_seqs, queue/status consistency and the block
manager's (and swap pool's) invariants. The fake runner also keeps a fake KV cache: it
executes the step's swap-outs, swap-ins and copies like the real runner, writes
(group, position, token) into each scheduled token's slot, and checks that every computed
position of a scheduled request reads back what was written for it.
"""

from __future__ import annotations

import random

import pytest

from pagedllm.core.block_manager import BlockManager
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.runner_output import RunnerOutput, SampledTokens
from pagedllm.core.scheduler import Scheduler
from pagedllm.core.scheduler_output import SchedulerOutput
from pagedllm.core.swap_manager import SwapManager
from pagedllm.sampling_params import SamplingParams

BS = 4
FAKE_TOKEN = 7


class Harness:
    """Scheduler + block manager + a fake model; finishes requests at their max_tokens."""

    def __init__(self, *, num_blocks: int = 64, budget: int = 16, max_num_seqs: int = 8,
                 swap_blocks: int | None = None) -> None:
        self.bm = BlockManager(num_blocks, BS)
        self.swap = None if swap_blocks is None else SwapManager(swap_blocks, self.bm)
        self.sched = Scheduler(self.bm, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=budget, max_model_len=1024,
                               swap_manager=self.swap)
        self.kv: dict[int, tuple] = {}      # fake device KV: slot -> (group, pos, token)
        self.cpu_kv: dict[int, tuple] = {}  # fake swap pool, same slot arithmetic
        self.all: list[Request] = []
        self.steps: list[SchedulerOutput] = []
        self.sampled: list[Request] = []   # requests that sampled in the last step
        self.max_running = max_num_seqs     # n > 1 fan-outs may exceed max_num_seqs

    def add(self, rid: str, num_prompt_tokens: int, max_tokens: int = 4, n: int = 1
            ) -> Request:
        req = Request(rid, list(range(10, 10 + num_prompt_tokens)),
                      SamplingParams(max_tokens=max_tokens, n=n), eos_token_id=None)
        req.max_tokens = max_tokens
        self.sched.add_request(req)
        self.all.append(req)
        return req

    def check(self) -> None:
        s = self.sched
        self.bm.check_invariants(self.all)
        assert all(r.status == RequestStatus.RUNNING for r in s.running)
        assert all(r.status == RequestStatus.WAITING for r in s.waiting)
        assert all(r.status == RequestStatus.SWAPPED for r in s.swapped)
        if self.swap is not None:
            self.swap.check_invariants(self.all)
        assert all(not r.block_ids and r.num_computed_tokens == 0 for r in s.waiting)
        assert len(s.running) <= self.max_running
        assert len({id(r) for r in s.requests}) == len(s.requests)
        finished = [r for r in self.all if r.is_finished]
        assert not set(map(id, finished)) & set(map(id, s.requests))

    def step(self) -> SchedulerOutput:
        out = self.sched.schedule()
        assert out.num_batched_tokens <= self.sched.max_num_batched_tokens
        assert all(s.num_new_tokens >= 1 for s in out.scheduled)
        assert len(out.scheduled) <= self.sched.max_num_seqs
        assert len({id(s.request) for s in out.scheduled}) == len(out.scheduled)
        for s in out.scheduled:
            req = s.request
            assert req.status == RequestStatus.RUNNING
            assert len(req.block_ids) * BS >= req.num_computed_tokens + s.num_new_tokens
            assert req.num_computed_tokens + s.num_new_tokens <= req.num_tokens
        self.check()
        self.fake_forward(out)
        self.sampled = [s.request for s in out.scheduled if s.samples]
        update = self.sched.update_from_output(out, RunnerOutput([  # the fake model's outputs
            SampledTokens(req, [FAKE_TOKEN] * (1 if req.forked else req.sampling_params.n))
            for req in self.sampled]))
        self.all += update.forked                      # an n > 1 request fanned out
        assert update.appended == dict.fromkeys(self.sampled + update.forked, 1)
        for req in self.sampled:
            assert req.is_finished or req.num_computed_tokens == req.num_tokens - 1
            assert req.is_finished == (req.num_output_tokens >= req.max_tokens)
        self.check()
        self.steps.append(out)
        return out

    def fake_forward(self, out: SchedulerOutput) -> None:
        def move(src: dict, dst: dict, pairs) -> None:
            for a, b in pairs:
                for off in range(BS):
                    dst[b * BS + off] = src.get(a * BS + off)

        move(self.kv, self.cpu_kv, out.blocks_to_swap_out)
        move(self.cpu_kv, self.kv, out.blocks_to_swap_in)
        move(self.kv, self.kv, out.blocks_to_copy)
        for s in out.scheduled:
            req = s.request
            for pos in range(req.num_computed_tokens + s.num_new_tokens):
                slot = req.block_ids[pos // BS] * BS + pos % BS
                want = (req.group_id, pos, req.all_token_ids[pos])
                if pos >= req.num_computed_tokens:
                    self.kv[slot] = want
                assert self.kv.get(slot) == want, f"{req}: position {pos} has wrong KV"

    def run(self, max_steps: int = 500) -> None:
        while self.sched.has_unfinished():
            self.step()
            assert len(self.steps) < max_steps, "no progress"

    @staticmethod
    def plan(out: SchedulerOutput) -> list[tuple[str, int]]:
        return [(s.request.request_id, s.num_new_tokens) for s in out.scheduled]


def test_empty_scheduler_schedules_nothing() -> None:
    h = Harness()
    out = h.sched.schedule()
    assert out.is_empty and out.num_batched_tokens == 0 and not h.sched.has_unfinished()


def test_prefill_then_decode_until_max_tokens() -> None:
    h = Harness()
    a = h.add("a", 5, max_tokens=3)
    assert h.plan(h.step()) == [("a", 5)]
    assert a.output_token_ids == [FAKE_TOKEN] and a.num_computed_tokens == 5
    assert h.plan(h.step()) == [("a", 1)]
    assert h.plan(h.step()) == [("a", 1)]
    assert a.status == RequestStatus.FINISHED_LENGTH and a.num_output_tokens == 3
    assert not h.sched.has_unfinished() and h.bm.num_free_blocks == h.bm.num_blocks


def test_running_first_then_waiting_in_arrival_order() -> None:
    h = Harness(budget=64)
    h.add("a", 3, max_tokens=10)
    h.add("b", 3, max_tokens=10)
    h.step()                                   # both prefilled, now decoding
    h.add("c", 6)
    h.add("d", 2)
    assert h.plan(h.step()) == [("a", 1), ("b", 1), ("c", 6), ("d", 2)]
    assert [r.request_id for r in h.sched.running] == ["a", "b", "c", "d"]


def test_token_budget_caps_prefill_and_admission() -> None:
    h = Harness(budget=10)
    h.add("a", 6)
    h.add("b", 6)
    h.add("c", 6)
    # a takes 6, b gets the remaining 4 (a chunk), c waits: the budget is spent.
    assert h.plan(h.step()) == [("a", 6), ("b", 4)]
    assert [r.request_id for r in h.sched.waiting] == ["c"]
    assert h.plan(h.step()) == [("a", 1), ("b", 2), ("c", 6)]


def test_chunked_prefill_of_a_long_prompt_while_another_request_decodes() -> None:
    h = Harness(budget=8)
    short = h.add("short", 3, max_tokens=20)
    h.step()
    long = h.add("long", 30, max_tokens=2)
    chunks = []
    while long.num_output_tokens == 0:
        out = h.step()
        plan = dict(h.plan(out))
        assert plan["short"] == 1             # the decode is never starved
        assert sum(plan.values()) <= 8
        chunks.append(plan["long"])
        assert short in h.sampled
        assert (long in h.sampled) == (long.num_computed_tokens == long.num_prompt_tokens)
    assert chunks == [7, 7, 7, 7, 2]
    assert short.num_output_tokens == 1 + len(chunks)
    h.run()


@pytest.mark.parametrize("max_num_seqs", [1, 2, 3])
def test_max_num_seqs(max_num_seqs: int) -> None:
    h = Harness(budget=64, max_num_seqs=max_num_seqs)
    for i in range(6):
        h.add(f"r{i}", 3, max_tokens=3)
    peak = 0
    while h.sched.has_unfinished():
        h.step()
        peak = max(peak, len(h.sched.running))
        assert len(h.steps[-1].scheduled) <= max_num_seqs
    assert peak == max_num_seqs
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in h.all)


def test_max_num_seqs_caps_each_step_after_a_fan_out() -> None:
    h = Harness(budget=64, max_num_seqs=2)
    h.add("p", 6, max_tokens=5, n=3)
    h.max_running = 3
    h.step()                                         # its prompt; it fans out into 3
    assert [r.request_id for r in h.all] == ["p", "p-1", "p-2"]
    assert all(r.output_token_ids == [FAKE_TOKEN] for r in h.all)
    out = h.step()
    assert h.plan(out) == [("p", 1), ("p-1", 1)]    # p-2 waits, holding its blocks
    assert out.blocks_to_copy                        # the shared partial block was copied
    h.run()
    assert [r.num_output_tokens for r in h.all] == [5, 5, 5]
    assert all(len(o.scheduled) <= 2 for o in h.steps)


def test_preempts_most_recently_admitted_when_blocks_run_out() -> None:
    # 6 blocks of 4 slots; three 8-token prompts fill the pool exactly.
    h = Harness(num_blocks=6, budget=64)
    a, b, c = (h.add(rid, 8, max_tokens=6) for rid in "abc")
    d = h.add("d", 2, max_tokens=2)            # does not fit: waits
    assert h.plan(h.step()) == [("a", 8), ("b", 8), ("c", 8)]
    assert h.bm.num_free_blocks == 0 and list(h.sched.waiting) == [d]
    c_blocks = list(c.block_ids)

    out = h.step()                             # a needs a 3rd block: c (newest) is preempted
    assert out.preempted == [c]
    assert h.plan(out) == [("a", 1), ("b", 1)]  # b got c's freed block; nothing admitted
    assert c.status == RequestStatus.WAITING and c.num_computed_tokens == 0
    assert c.block_ids == [] and c.num_preemptions == 1 and h.sched.num_preemptions == 1
    assert list(h.sched.waiting) == [c, d]     # front of the queue, ahead of d
    assert c.output_token_ids == [FAKE_TOKEN]  # generated tokens are kept ...
    assert set(c_blocks) & (set(a.block_ids) | set(b.block_ids))

    h.run()                                    # ... and recomputed on resumption
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in (a, b, c, d))
    assert c.num_output_tokens == 6 and c.num_preemptions >= 1
    # The resumed request prefilled its prompt plus the token it had generated.
    resumed = next(s for out in h.steps[2:] for s in out.scheduled
                   if s.request is c and s.num_new_tokens > 1)
    assert resumed.num_new_tokens == 9
    assert h.bm.num_free_blocks == h.bm.num_blocks


def test_request_that_cannot_grow_preempts_itself_when_it_is_newest() -> None:
    h = Harness(num_blocks=3, budget=64)
    a = h.add("a", 6, max_tokens=2)            # 2 blocks; its next slot (6) is in block 1
    b = h.add("b", 4, max_tokens=4)            # 1 block, full
    h.step()
    assert h.bm.num_free_blocks == 0
    out = h.step()                             # b needs a 2nd block; the newest is b itself
    assert out.preempted == [b] and h.plan(out) == [("a", 1)]
    assert b.status == RequestStatus.WAITING and b.block_ids == []
    assert b.num_computed_tokens == 0 and list(h.sched.waiting) == [b]
    h.run()
    assert a.num_output_tokens == 2 and b.num_output_tokens == 4


def test_preemption_under_pressure_keeps_everything_consistent() -> None:
    rng = random.Random(0)
    h = Harness(num_blocks=12, budget=12, max_num_seqs=6)
    for i in range(12):
        h.add(f"r{i}", rng.randint(1, 20), max_tokens=rng.randint(1, 16))
    for _ in range(4):                         # more arrivals while running
        h.step()
        h.add(f"late{len(h.all)}", rng.randint(1, 20), max_tokens=rng.randint(1, 16))
    h.run()
    assert h.sched.num_preemptions > 0
    for r in h.all:
        assert r.status == RequestStatus.FINISHED_LENGTH
        assert r.output_token_ids == [FAKE_TOKEN] * r.max_tokens
    assert h.bm.num_free_blocks == h.bm.num_blocks


def test_finish_request_frees_blocks_from_either_queue() -> None:
    h = Harness(budget=8)
    a = h.add("a", 6)
    b = h.add("b", 12)
    h.step()                                   # a prefilled; b got a 2-token chunk
    assert b.status == RequestStatus.RUNNING and b.block_ids
    c = h.add("c", 3)
    h.sched.finish_request(b, RequestStatus.FINISHED_ABORTED)
    h.sched.finish_request(c, RequestStatus.FINISHED_ABORTED)
    assert b.block_ids == [] and c not in h.sched.waiting and b not in h.sched.running
    assert b.times.finished is not None
    h.check()
    h.sched.finish_request(a, RequestStatus.FINISHED_ABORTED)
    assert h.bm.num_free_blocks == h.bm.num_blocks and not h.sched.has_unfinished()


# ------------------------------------------------------------------- swap preemption
def test_swap_preemption_moves_blocks_to_cpu_and_back() -> None:
    h = Harness(num_blocks=6, budget=64, swap_blocks=8)
    a, b, c = (h.add(rid, 8, max_tokens=6) for rid in "abc")
    d = h.add("d", 2, max_tokens=2)
    h.step()
    c_blocks = list(c.block_ids)

    out = h.step()                             # a needs a 3rd block: c is swapped out
    assert out.preempted == out.swapped_out == [c]
    assert h.plan(out) == [("a", 1), ("b", 1)]
    assert c.status == RequestStatus.SWAPPED and c.block_ids == []
    assert c.num_computed_tokens == 8 and c.num_preemptions == 1
    assert out.blocks_to_swap_out == list(zip(c_blocks, c.swapped_block_ids, strict=True))
    assert list(h.sched.swapped) == [c] and list(h.sched.waiting) == [d]
    assert h.swap.num_free_blocks == 6 and h.sched.num_swap_outs == 1

    h.run()
    # Later b is swapped out too (a grows again) and, older than c, swapped in first; d is
    # admitted only once no request is left swapped out.
    ins = [(i, r.request_id) for i, o in enumerate(h.steps) for r in o.swapped_in]
    assert [rid for _, rid in ins] == ["b", "c"]
    c_in = h.steps[ins[1][0]]
    assert h.plan(c_in) == [("c", 1), ("d", 2)]
    assert [cpu for cpu, _ in c_in.blocks_to_swap_in] == [0, 1]
    assert not any(("d", 2) in h.plan(o) for o in h.steps[:ins[1][0]])
    assert all(s.num_new_tokens == 1 for o in h.steps[1:] for s in o.scheduled
               if s.request is c)
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in (a, b, c, d))
    assert h.bm.num_free_blocks == h.bm.num_blocks and h.swap.num_free_blocks == 8


def test_full_swap_pool_falls_back_to_recompute() -> None:
    h = Harness(num_blocks=6, budget=64, swap_blocks=1)   # c needs 2 CPU blocks
    _, _, c = (h.add(rid, 8, max_tokens=6) for rid in "abc")
    h.step()
    out = h.step()
    assert out.preempted == [c] and out.swapped_out == [] and not out.blocks_to_swap_out
    assert c.status == RequestStatus.WAITING and c.num_computed_tokens == 0
    assert h.sched.num_preemptions == 1 and h.sched.num_swap_outs == 0
    h.run()
    assert c.num_output_tokens == 6 and h.swap.num_free_blocks == 1


def test_aborting_a_swapped_request_frees_its_cpu_blocks() -> None:
    h = Harness(num_blocks=6, budget=64, swap_blocks=8)
    _, _, c = (h.add(rid, 8, max_tokens=6) for rid in "abc")
    h.step()
    h.step()
    assert c.status == RequestStatus.SWAPPED
    h.sched.finish_request(c, RequestStatus.FINISHED_ABORTED)
    assert c.swapped_block_ids == [] and not h.sched.swapped
    assert h.swap.num_free_blocks == 8
    h.check()
    h.run()


@pytest.mark.parametrize("swap_blocks", [4, 64])
def test_swap_under_pressure_with_forks_keeps_kv_and_invariants(swap_blocks: int) -> None:
    """Random load on a small pool with n = 2 forks (shared prompt blocks): the fake KV
    cache proves every swapped-in request reads back its own tokens; a small swap pool
    mixes swap and recompute preemptions."""
    rng = random.Random(swap_blocks)
    h = Harness(num_blocks=12, budget=12, max_num_seqs=6, swap_blocks=swap_blocks)
    h.max_running = 64
    parents = []
    for i in range(12):
        n = 2 if i % 3 == 0 else 1
        req = h.add(f"r{i}", rng.randint(1, 20), max_tokens=rng.randint(2, 16), n=n)
        if n > 1:
            parents.append(req)
    while h.sched.has_unfinished():
        h.step()
        for p in [p for p in parents if p in h.sampled and not p.forked]:
            p.forked = True                        # what the output processor does
            child = p.fork(f"{p.request_id}-1", 1)
            h.bm.fork(p, child)
            h.sched.add_running(child)
            h.all.append(child)
            h.check()
        assert len(h.steps) < 2000
    assert h.sched.num_swap_outs > 0
    if swap_blocks == 4:
        assert h.sched.num_preemptions > h.sched.num_swap_outs
    assert sum(len(o.blocks_to_swap_in) for o in h.steps) == sum(
        len(o.blocks_to_swap_out) for o in h.steps)
    for r in h.all:
        assert r.status == RequestStatus.FINISHED_LENGTH
        assert r.num_output_tokens == r.max_tokens
    assert h.bm.num_free_blocks == h.bm.num_blocks
    assert h.swap.num_free_blocks == swap_blocks
