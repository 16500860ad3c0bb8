"""The "priority" scheduling policy (core/waiting_queue.py, Scheduler._victim_index) and the
waiting queue's O(1) group count and one-pass bulk removal, with the fake-model harness of
test_scheduler.py."""

from __future__ import annotations

from test_scheduler import Harness

from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.waiting_queue import WaitingQueue
from pagedllm.sampling_params import SamplingParams


def priority_harness(**kwargs) -> Harness:
    h = Harness(**kwargs)
    h.sched.waiting = WaitingQueue("priority")
    return h


def add(h: Harness, rid: str, num_prompt: int, priority: int, max_tokens: int = 4) -> Request:
    req = Request(rid, list(range(10, 10 + num_prompt)), SamplingParams(max_tokens=max_tokens),
                  eos_token_id=None, priority=priority)
    req.max_tokens = max_tokens
    h.sched.add_request(req)
    h.all.append(req)
    return req


def test_late_high_priority_request_overtakes_queued_low_priority_ones() -> None:
    h = priority_harness(max_num_seqs=1)
    a = add(h, "a", 4, priority=5, max_tokens=3)
    h.step()                                   # a runs; one sequence at a time
    b, c = add(h, "b", 4, priority=5), add(h, "c", 4, priority=5)
    d = add(h, "d", 4, priority=0)             # arrives last, runs first after a
    assert [r.request_id for r in h.sched.waiting] == ["d", "b", "c"]
    h.run()
    order = sorted((a, b, c, d), key=lambda r: r.times.finished)
    assert [r.request_id for r in order] == ["a", "d", "b", "c"]


def test_equal_priorities_keep_arrival_order_and_fcfs_ignores_priority() -> None:
    q = WaitingQueue("priority")
    reqs = [Request(str(i), [1], SamplingParams(), eos_token_id=None, priority=p)
            for i, p in enumerate([3, 1, 3, 1, 2])]
    for r in reqs:
        q.append(r)
    assert [r.request_id for r in q] == ["1", "3", "4", "0", "2"]
    fcfs = WaitingQueue("fcfs")
    for r in reqs:
        fcfs.append(r)
    assert [r.request_id for r in fcfs] == ["0", "1", "2", "3", "4"]


def test_preemption_picks_the_lowest_priority_not_the_newest() -> None:
    h = priority_harness(num_blocks=6, budget=64)
    a = add(h, "a", 8, priority=0, max_tokens=6)
    b = add(h, "b", 8, priority=9, max_tokens=6)
    c = add(h, "c", 8, priority=0, max_tokens=6)
    h.step()                                   # the three prompts fill the pool
    out = h.step()                             # a needs a block: b goes, though c is newer
    assert out.preempted == [b]
    assert b.status == RequestStatus.WAITING and c.status == RequestStatus.RUNNING
    h.run()
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in (a, b, c))


def test_victim_already_scheduled_this_step_is_taken_back() -> None:
    h = priority_harness(num_blocks=4, budget=64)
    b = add(h, "b", 7, priority=9, max_tokens=4)  # 2 blocks, one slot left in the second
    a = add(h, "a", 8, priority=0, max_tokens=4)  # 2 full blocks
    h.step()
    out = h.step()  # b decodes into its free slot (scheduled), then a needs a 3rd block
    assert out.preempted == [b]
    assert h.plan(out) == [("a", 1)]
    h.run()
    assert a.num_output_tokens == 4 and b.num_output_tokens == 4


def test_group_count_and_bulk_removal() -> None:
    q = WaitingQueue("fcfs")
    reqs = [Request(f"r{i}", [1], SamplingParams(), eos_token_id=None) for i in range(1000)]
    for r in reqs:
        q.append(r)
    sibling = Request("r0-1", [1], SamplingParams(), eos_token_id=None, group_id="r0")
    q.append(sibling)                          # an n > 1 sibling counts with its group
    assert len(q) == 1001 and q.num_groups == 1000
    q.remove_many(reqs[::2])
    assert len(q) == 501 and q.num_groups == 501  # r0 stays through its sibling
    assert [r.request_id for r in q][:3] == ["r1", "r3", "r5"]
    q.remove_many([sibling, *reqs[1::2]])
    assert not q and q.num_groups == 0
