"""BlockManager unit tests: allocation, append, free order (tests/core/test_prefix_cache.py
has the order with cached blocks), fork + copy-on-write, failure
atomicity, and that check_invariants() (run after every operation here) catches corruption."""

from __future__ import annotations

import pytest

from pagedllm.core.block_manager import BlockInvariantError, BlockManager
from pagedllm.core.request import Request, RequestStatus
from pagedllm.errors import InvariantError
from pagedllm.sampling_params import SamplingParams

BS = 4


def make_request(rid: str, num_prompt_tokens: int) -> Request:
    return Request(rid, list(range(num_prompt_tokens)), SamplingParams(n=2), eos_token_id=None)


class Pool:
    """A BlockManager plus the requests that may hold blocks; every helper checks invariants."""

    def __init__(self, num_blocks: int) -> None:
        self.bm = BlockManager(num_blocks, BS)
        self.requests: list[Request] = []

    def check(self) -> None:
        self.bm.check_invariants(self.requests)

    def new(self, rid: str, num_prompt_tokens: int) -> Request:
        req = make_request(rid, num_prompt_tokens)
        self.requests.append(req)
        return req

    def compute(self, req: Request, num_new_tokens: int) -> bool:
        """allocate_slots, then mark the tokens computed (what the scheduler + runner do)."""
        ok = self.bm.allocate_slots(req, num_new_tokens)
        if ok:
            req.num_computed_tokens += num_new_tokens
        self.check()
        return ok

    def fork(self, parent: Request, rid: str) -> Request:
        child = parent.fork(rid, 1)
        self.requests.append(child)
        self.bm.fork(parent, child)
        self.check()
        return child

    def free(self, req: Request) -> None:
        """Finish `req` and release its blocks (what Scheduler.finish_request does)."""
        req.status = RequestStatus.FINISHED_STOPPED
        self.bm.free(req)
        self.check()

    def snapshot(self) -> tuple:
        bm = self.bm
        return ([list(r.block_ids) for r in self.requests], list(bm.free_queue),
                [b.ref_cnt for b in bm.blocks], list(bm.pending_copies))


def test_rejects_empty_pool() -> None:
    with pytest.raises(ValueError, match="num_blocks must be >= 1, got 0"):
        BlockManager(0, BS)


def test_allocate_prompt_takes_blocks_in_free_queue_order() -> None:
    pool = Pool(8)
    pool.check()
    req = pool.new("a", 10)
    assert pool.bm.blocks_needed(req, 10) == 3
    assert pool.compute(req, 10)
    assert req.block_ids == [0, 1, 2]
    assert [pool.bm.blocks[b].ref_cnt for b in req.block_ids] == [1, 1, 1]
    assert pool.bm.num_free_blocks == 5
    assert pool.bm.usage == pytest.approx(3 / 8)


def test_append_takes_a_new_block_only_when_the_last_is_full() -> None:
    pool = Pool(8)
    req = pool.new("a", 10)              # slots 0..9: blocks [0, 1, 2], block 2 holds 2 of 4
    pool.compute(req, 10)
    for pos in (10, 11):                 # positions 10, 11 still fit in block 2
        assert pool.bm.blocks_needed(req, 1) == 0
        assert pool.compute(req, 1)
        assert req.block_ids == [0, 1, 2], pos
    assert pool.bm.blocks_needed(req, 1) == 1
    assert pool.compute(req, 1)          # position 12 opens block 3
    assert req.block_ids == [0, 1, 2, 3]
    assert pool.bm.num_free_blocks == 4
    assert pool.bm.pending_copies == []  # appends never copy


def test_chunked_allocation_matches_one_shot() -> None:
    pool = Pool(8)
    req = pool.new("a", 13)
    for chunk in (5, 5, 3):
        assert pool.compute(req, chunk)
    assert req.block_ids == [0, 1, 2, 3]
    assert req.num_computed_tokens == 13


def test_freed_blocks_are_taken_next_in_table_order() -> None:
    """Without caching a freed block holds nothing to keep: it goes to the head of the free
    queue (its memory is mapped and warm), and a request's blocks come back in table order."""
    pool = Pool(4)
    a = pool.new("a", 4 * BS)
    pool.compute(a, 4 * BS)
    assert a.block_ids == [0, 1, 2, 3] and pool.bm.num_free_blocks == 0
    pool.free(a)
    assert a.block_ids == [] and pool.bm.num_free_blocks == 4
    assert list(pool.bm.free_queue) == [0, 1, 2, 3]
    b = pool.new("b", 2 * BS)
    pool.compute(b, 2 * BS)
    assert b.block_ids == [0, 1]


def test_freed_blocks_queue_before_never_used_ones() -> None:
    """The pool's working set stays as large as the peak load: freed blocks are reused before
    the never-used ones are touched."""
    pool = Pool(6)
    a = pool.new("a", 2 * BS)
    pool.compute(a, 2 * BS)
    pool.free(a)
    assert list(pool.bm.free_queue) == [0, 1, 2, 3, 4, 5]
    b = pool.new("b", 3 * BS)
    pool.compute(b, 3 * BS)
    assert b.block_ids == [0, 1, 2]


def test_fork_shares_blocks_with_refcount() -> None:
    pool = Pool(8)
    parent = pool.new("p", 2 * BS)
    pool.compute(parent, 2 * BS)
    child = pool.fork(parent, "c")
    assert child.block_ids == parent.block_ids == [0, 1]
    assert child.block_ids is not parent.block_ids
    assert [pool.bm.blocks[b].ref_cnt for b in (0, 1)] == [2, 2]
    assert pool.bm.num_free_blocks == 6
    pool.free(parent)                     # the child still holds both blocks
    assert [pool.bm.blocks[b].ref_cnt for b in (0, 1)] == [1, 1]
    assert pool.bm.num_free_blocks == 6
    pool.free(child)
    assert pool.bm.num_free_blocks == 8


def test_copy_on_write_of_a_shared_partial_block() -> None:
    pool = Pool(8)
    parent = pool.new("p", 6)             # blocks [0, 1]; block 1 holds positions 4, 5
    pool.compute(parent, 6)
    parent.append_token(100)
    child = pool.fork(parent, "c")
    child.append_token(200)
    # The child's next token goes to position 6, inside shared block 1: copy it first.
    assert pool.bm.blocks_needed(child, 1) == 1
    assert pool.compute(child, 1)
    assert child.block_ids == [0, 2]
    assert pool.bm.take_pending_copies() == [(1, 2)]
    assert pool.bm.pending_copies == []
    assert [pool.bm.blocks[b].ref_cnt for b in (0, 1, 2)] == [2, 1, 1]
    # The parent is now the only holder of block 1: it writes in place, no copy.
    assert pool.bm.blocks_needed(parent, 1) == 0
    assert pool.compute(parent, 1)
    assert parent.block_ids == [0, 1]
    assert pool.bm.pending_copies == []


def test_shared_full_block_is_never_copied() -> None:
    pool = Pool(8)
    parent = pool.new("p", 2 * BS)        # both blocks full
    pool.compute(parent, 2 * BS)
    child = pool.fork(parent, "c")
    for req in (parent, child):
        req.append_token(1)
        assert pool.compute(req, 1)
    assert pool.bm.pending_copies == []
    assert parent.block_ids[:2] == child.block_ids[:2] == [0, 1]
    assert parent.block_ids[2] != child.block_ids[2]


@pytest.mark.parametrize(("fork", "num_new", "num_free"), [
    (False, 3 * BS, 2),   # needs 3 new blocks, 2 free
    (True, 1, 0),         # the child's write into shared block 1 needs a copy, none free
    (True, 3, 1),         # copy + one new block needed, 1 free
])
def test_allocate_slots_is_all_or_nothing(fork: bool, num_new: int, num_free: int) -> None:
    pool = Pool(4)
    req = pool.new("a", 6)                # blocks [0, 1], block 1 half full
    pool.compute(req, 6)
    target = pool.fork(req, "c") if fork else req
    hog = pool.new("hog", (2 - num_free) * BS)
    pool.compute(hog, hog.num_tokens)
    assert pool.bm.num_free_blocks == num_free
    before = pool.snapshot()
    assert pool.bm.blocks_needed(target, num_new) > num_free
    assert not pool.compute(target, num_new)
    assert pool.snapshot() == before


def test_zero_new_tokens_needs_nothing() -> None:
    pool = Pool(2)
    req = pool.new("a", 5)
    pool.compute(req, 5)
    child = pool.fork(req, "c")
    assert pool.bm.blocks_needed(child, 0) == 0
    assert pool.compute(child, 0)
    assert pool.bm.pending_copies == []


# ------------------------------------------------------------------ corruption is detected
def _healthy_pool() -> tuple[Pool, Request, Request]:
    pool = Pool(8)
    a = pool.new("a", 6)
    pool.compute(a, 6)
    b = pool.fork(a, "b")
    pool.check()
    return pool, a, b


def test_detects_wrong_refcount() -> None:
    pool, a, _ = _healthy_pool()
    pool.bm.blocks[a.block_ids[0]].ref_cnt += 1
    with pytest.raises(BlockInvariantError, match="ref_cnt 3 but held by 2"):
        pool.check()


def test_detects_refcount_too_low() -> None:
    pool, a, _ = _healthy_pool()
    pool.bm.blocks[a.block_ids[1]].ref_cnt -= 1   # a later free would release a held block
    with pytest.raises(BlockInvariantError, match="ref_cnt 1 but held by 2"):
        pool.check()


def test_finished_request_with_stale_progress_is_consistent() -> None:
    pool, a, b = _healthy_pool()
    pool.free(b)                          # finished, no blocks, num_computed_tokens kept
    assert b.num_computed_tokens == 6
    pool.check()


def test_detects_block_both_free_and_used() -> None:
    pool, a, _ = _healthy_pool()
    bid = a.block_ids[1]
    pool.bm.free_queue[bid] = pool.bm.blocks[bid]
    with pytest.raises(BlockInvariantError, match=f"block {bid} is free with ref_cnt 2"):
        pool.check()


def test_detects_unreferenced_block_missing_from_free_queue() -> None:
    pool, _, _ = _healthy_pool()
    del pool.bm.free_queue[7]            # leaked: nobody holds it, yet it is not free
    with pytest.raises(BlockInvariantError, match="block 7 is not free with ref_cnt 0"):
        pool.check()


def test_detects_finished_request_holding_blocks() -> None:
    pool, a, _ = _healthy_pool()
    a.status = RequestStatus.FINISHED_ABORTED
    with pytest.raises(BlockInvariantError, match="finished .* still holds blocks"):
        pool.check()


def test_detects_block_held_twice_by_one_table() -> None:
    pool = Pool(8)
    a = pool.new("a", 2)
    pool.compute(a, 2)
    a.block_ids.append(a.block_ids[0])
    pool.bm.blocks[a.block_ids[0]].ref_cnt += 1
    with pytest.raises(BlockInvariantError, match="holds a block twice"):
        pool.check()


def test_detects_computed_tokens_beyond_blocks() -> None:
    pool = Pool(8)
    a = pool.new("a", 6)
    pool.compute(a, 6)
    a.num_computed_tokens = 9
    with pytest.raises(BlockInvariantError, match="computed tokens beyond its blocks"):
        pool.check()


def test_invariant_error_is_a_bug_not_a_user_error_nor_an_assertion() -> None:
    # A ValueError would be answered as bad input (400); an AssertionError would read as a
    # failed test assertion. It is pagedllm's InvariantError, which the idle check reports.
    assert issubclass(BlockInvariantError, InvariantError)
    assert not issubclass(BlockInvariantError, ValueError)
    assert not issubclass(BlockInvariantError, AssertionError)
