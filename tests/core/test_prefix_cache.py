"""Prefix caching in the BlockManager: chained hashes, hits shared by refcount, the last token
always recomputed, LRU eviction (a request's last block first), token checks that survive
forced hash collisions, cache_salt isolation, and invariants checked after every operation."""

from __future__ import annotations

import pytest

from pagedllm.core import prefix_cache
from pagedllm.core.block_manager import BlockInvariantError, BlockManager
from pagedllm.core.prefix_cache import hash_block_tokens, update_block_hashes
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.runner_output import RunnerOutput
from pagedllm.core.scheduler import Scheduler
from pagedllm.sampling_params import SamplingParams

BS = 4
NO_EXTRA = (None, None)


class Pool:
    """A caching BlockManager plus the requests holding blocks; every helper checks invariants."""

    def __init__(self, num_blocks: int = 16) -> None:
        self.bm = BlockManager(num_blocks, BS, enable_caching=True)
        self.requests: list[Request] = []

    def check(self) -> None:
        self.bm.check_invariants(self.requests)

    def new(self, rid: str, tokens: list[int], salt: str | None = None, n: int = 1) -> Request:
        req = Request(rid, tokens, SamplingParams(n=n), eos_token_id=None, cache_salt=salt)
        self.requests.append(req)
        return req

    def admit(self, req: Request) -> list[int]:
        """What the scheduler does for a waiting request: look up, allocate the rest."""
        hits = self.bm.get_computed_blocks(req)
        num_new = req.num_tokens - len(hits) * BS
        assert self.bm.allocate_slots(req, num_new, hits)
        req.num_computed_tokens = len(hits) * BS
        self.check()
        return hits

    def computed(self, req: Request) -> None:
        """The forward pass ran: everything allocated is computed and full blocks registered."""
        req.num_computed_tokens = req.num_tokens
        self.bm.cache_full_blocks(req)
        self.check()

    def run(self, req: Request) -> list[int]:
        hits = self.admit(req)
        self.computed(req)
        return hits

    def append(self, req: Request, token: int) -> None:
        req.append_token(token)
        assert self.bm.allocate_slots(req, 1)
        self.computed(req)

    def free(self, req: Request) -> None:
        req.status = RequestStatus.FINISHED_STOPPED
        self.bm.free(req)
        self.check()

    def cached(self, block_id: int) -> bool:
        return self.bm.blocks[block_id].block_hash is not None


def test_block_hashes_chain_over_the_prefix() -> None:
    pool = Pool()
    a = pool.new("a", list(range(10)))             # 2 full blocks + 2 tokens
    h = update_block_hashes(a, BS)
    h0 = hash_block_tokens(None, [0, 1, 2, 3], NO_EXTRA)
    assert h == [h0, hash_block_tokens(h0, [4, 5, 6, 7], NO_EXTRA)]
    # The same tokens after a different first block hash differently ...
    b = pool.new("b", [9, 1, 2, 3, 4, 5, 6, 7])
    hb = update_block_hashes(b, BS)
    assert hb[0] != h[0] and hb[1] != h[1]
    # ... and so do the same tokens under a salt.
    assert update_block_hashes(pool.new("c", list(range(8)), salt="s"), BS)[0] != h0
    a.append_token(10)
    a.append_token(11)                             # the third block is now full
    assert len(update_block_hashes(a, BS)) == 3 and a.block_hashes[:2] == h[:2]


def test_hits_are_shared_by_refcount_and_stay_cached_after_free() -> None:
    pool = Pool()
    a = pool.new("a", list(range(10)))
    assert pool.run(a) == []
    shared = a.block_ids[:2]
    assert [pool.cached(b) for b in a.block_ids] == [True, True, False]   # partial: never
    b = pool.new("b", [*range(8), 100, 101, 102])
    assert pool.admit(b) == shared
    assert b.num_computed_tokens == 8 and b.block_ids[:2] == shared and b.num_cached_blocks == 2
    assert [pool.bm.blocks[i].ref_cnt for i in shared] == [2, 2]
    pool.computed(b)
    pool.free(a)
    assert [pool.bm.blocks[i].ref_cnt for i in shared] == [1, 1]
    pool.free(b)
    assert pool.bm.num_free_blocks == pool.bm.num_blocks       # cached blocks count as free
    assert all(pool.cached(i) and i in pool.bm.free_queue for i in shared)
    c = pool.new("c", list(range(9)))
    assert pool.admit(c) == shared                              # a hit leaves the free queue
    assert not any(i in pool.bm.free_queue for i in shared)
    assert pool.bm.num_free_blocks == pool.bm.num_blocks - 3


@pytest.mark.parametrize(("num_tokens", "hits"), [(8, 1), (9, 2), (7, 1), (4, 0), (1, 0)])
def test_the_last_token_is_always_recomputed(num_tokens: int, hits: int) -> None:
    pool = Pool()
    pool.run(pool.new("a", list(range(12))))
    b = pool.new("b", list(range(num_tokens)))    # an exact prefix of a's prompt
    assert len(pool.admit(b)) == hits
    assert b.num_computed_tokens == hits * BS < b.num_tokens


def test_a_recomputed_cached_block_is_swapped_for_the_cached_one() -> None:
    pool = Pool()
    a = pool.new("a", list(range(8)))
    pool.run(a)
    b = pool.new("b", list(range(8)))             # hits block 0, recomputes block 1
    pool.admit(b)
    own = b.block_ids[1]
    pool.computed(b)
    assert b.block_ids == a.block_ids and own in pool.bm.free_queue and not pool.cached(own)
    assert [pool.bm.blocks[i].ref_cnt for i in a.block_ids] == [2, 2]


def test_same_prefix_computed_twice_in_one_step_collapses_to_one_copy() -> None:
    pool = Pool()
    a, b = pool.new("a", list(range(9))), pool.new("b", list(range(9)))
    pool.admit(a)
    pool.admit(b)                                 # nothing cached yet: no hits
    assert set(a.block_ids).isdisjoint(b.block_ids)
    pool.computed(a)
    pool.computed(b)
    assert b.block_ids[:2] == a.block_ids[:2] and b.block_ids[2] != a.block_ids[2]
    assert len(pool.bm.prefix_cache) == 2
    assert pool.bm.num_free_blocks == pool.bm.num_blocks - 4


def test_forked_siblings_share_full_blocks_and_copy_only_the_partial_one() -> None:
    pool = Pool()
    parent = pool.new("p", list(range(6)), n=2)   # block 0 full (cached), block 1 partial
    pool.run(parent)
    parent.append_token(50)
    child = parent.fork("c", 1)
    pool.requests.append(child)
    pool.bm.fork(parent, child)
    assert child.num_cached_blocks == 1
    pool.check()
    partial = parent.block_ids[1]
    for req in (parent, child):
        assert pool.bm.allocate_slots(req, 1)     # position 6: the parent copies the shared
        req.num_computed_tokens += 1              # partial block, the child then owns it
        pool.check()
        pool.append(req, 60)                      # position 7: full, registered
    assert pool.bm.take_pending_copies() == [(partial, parent.block_ids[1])]
    # Identical siblings: the one registered second swapped its block for the first's.
    assert parent.block_ids == child.block_ids and all(map(pool.cached, parent.block_ids))
    assert partial in pool.bm.free_queue and not pool.cached(partial)
    child.append_token(1)
    parent.append_token(2)                        # they diverge: separate partial blocks
    for req in (parent, child):
        assert pool.bm.allocate_slots(req, 1)
        req.num_computed_tokens += 1
        pool.check()
    assert parent.block_ids[2] != child.block_ids[2]


def test_a_block_shared_by_siblings_is_not_swapped_for_a_cached_copy() -> None:
    """Swapping it in one sibling's table only would split their common prefix."""
    pool = Pool()
    x, parent = pool.new("x", list(range(9))), pool.new("p", list(range(9)), n=2)
    pool.admit(x)
    pool.admit(parent)
    parent.num_computed_tokens = 9                # computed, not registered before the fork
    child = parent.fork("c", 1)
    pool.requests.append(child)
    pool.bm.fork(parent, child)
    pool.computed(x)                              # x registers the same blocks first
    own = list(parent.block_ids)
    pool.computed(parent)
    pool.computed(child)
    assert parent.block_ids == child.block_ids == own
    assert parent.num_cached_blocks == child.num_cached_blocks == 0


def test_eviction_takes_least_recently_freed_first_and_a_requests_tail_first() -> None:
    pool = Pool(num_blocks=8)
    a = pool.new("a", list(range(13)))            # blocks: 3 full + 1 partial
    pool.run(a)
    a_full = a.block_ids[:3]
    pool.free(a)
    # a's partial block holds nothing cached: it is taken first; full ones queue at the tail
    assert list(pool.bm.free_queue) == [3, 4, 5, 6, 7, 2, 1, 0]
    hog = pool.new("hog", list(range(100, 120)))  # 5 blocks: a's partial block, 4 never used
    pool.admit(hog)
    assert all(map(pool.cached, a_full))          # nothing cached evicted yet
    more = pool.new("more", list(range(200, 204)))
    pool.admit(more)                              # evicts a's last full block, not its first
    assert more.block_ids == [a_full[2]] and not pool.cached(a_full[2])
    assert pool.cached(a_full[0]) and pool.cached(a_full[1])
    assert pool.bm.get_computed_blocks(pool.new("again", list(range(13)))) == a_full[:2]


def test_a_hit_makes_blocks_recently_used_again() -> None:
    pool = Pool(num_blocks=6)
    x, y = pool.new("x", list(range(5))), pool.new("y", list(range(50, 55)))
    pool.run(x)
    pool.run(y)
    x0, y0 = x.block_ids[0], y.block_ids[0]
    pool.free(x)                                  # x's blocks freed first ...
    pool.free(y)
    x2 = pool.new("x2", list(range(5)))
    assert pool.admit(x2) == [x0]
    pool.free(x2)                                 # ... but x's prefix was used again since
    # 5 blocks: two freed partial blocks and the two never used go first, the 5th evicts
    # y's prefix (freed before x's, which x2 used again since)
    hog = pool.new("hog", list(range(300, 320)))
    pool.admit(hog)
    assert not pool.cached(y0) and pool.cached(x0)
    assert pool.bm.get_computed_blocks(pool.new("y2", list(range(50, 55)))) == []
    assert pool.bm.get_computed_blocks(pool.new("x3", list(range(5)))) == [x0]


def test_allocation_counts_free_cached_hits_against_the_free_space() -> None:
    pool = Pool(num_blocks=4)
    a = pool.new("a", list(range(9)))
    pool.run(a)
    pool.free(a)                                  # 2 cached + 1 plain block, all free
    b = pool.new("b", list(range(17)))            # hits 2, needs 3 more: only 2 left
    hits = pool.bm.get_computed_blocks(b)
    assert len(hits) == 2
    before = (list(pool.bm.free_queue), [blk.ref_cnt for blk in pool.bm.blocks])
    assert not pool.bm.allocate_slots(b, 9, hits)
    assert (list(pool.bm.free_queue), [blk.ref_cnt for blk in pool.bm.blocks]) == before
    assert b.block_ids == [] and b.num_cached_blocks == 0
    pool.check()


def test_cache_salt_isolates_tenants() -> None:
    pool = Pool()
    prompt = list(range(9))
    pool.run(pool.new("t1", prompt, salt="tenant-1"))
    assert pool.admit(pool.new("t2", prompt, salt="tenant-2")) == []
    assert pool.admit(pool.new("plain", prompt)) == []
    assert len(pool.admit(pool.new("t1-again", prompt, salt="tenant-1"))) == 2


def test_a_forced_hash_collision_costs_a_miss_never_wrong_kv(monkeypatch) -> None:
    monkeypatch.setattr(prefix_cache, "hash_block_tokens", lambda *a: b"same")
    pool = Pool()
    a = pool.new("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    pool.run(a)
    assert a.num_cached_blocks == 1               # block 1's hash is taken by block 0
    b = pool.new("b", [9, 9, 9, 9, 5, 6, 7, 8, 9])
    assert pool.admit(b) == []                    # same hash, other tokens: a miss


def test_evicting_a_block_uncaches_its_subtree(monkeypatch) -> None:
    """With a hash that ignores tokens, a stale child must not be found under a new parent
    that reuses its old parent's block id and hash."""
    monkeypatch.setattr(prefix_cache, "hash_block_tokens",
                        lambda parent, tokens, extra: (parent or b"") + b".")
    pool = Pool(num_blocks=8)
    a = pool.new("a", [1, 1, 1, 1, 2, 2, 2, 2, 3])
    pool.run(a)
    a0, a1 = a.block_ids[:2]
    pool.free(a)
    pool.bm.free_queue.move_to_end(a0, last=False)  # make a's first block the next one taken
    b = pool.new("b", [7, 7, 7, 7])
    pool.run(b)
    assert b.block_ids == [a0] and not pool.cached(a1)
    c = pool.new("c", [7, 7, 7, 7, 2, 2, 2, 2, 3])   # block 1 = a's block 1 tokens
    assert pool.admit(c) == [a0]                  # not a1: its KV follows [1, 1, 1, 1]


def test_disabled_cache_never_hits_nor_hashes() -> None:
    bm = BlockManager(8, BS)
    a = Request("a", list(range(9)), SamplingParams(), eos_token_id=None)
    assert bm.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    bm.cache_full_blocks(a)
    b = Request("b", list(range(9)), SamplingParams(), eos_token_id=None)
    assert bm.get_computed_blocks(b) == [] and a.block_hashes == [] and bm.prefix_cache is None
    bm.check_invariants([a, b])


# ------------------------------------------------------------ invariants catch corruption
def _healthy() -> tuple[Pool, Request]:
    pool = Pool()
    a = pool.new("a", list(range(13)))
    pool.run(a)
    return pool, a


def test_detects_a_hash_that_does_not_match_its_entry() -> None:
    pool, a = _healthy()
    pool.bm.blocks[a.block_ids[1]].block_hash = pool.bm.blocks[a.block_ids[0]].block_hash
    with pytest.raises(BlockInvariantError, match="does not match the block's hash"):
        pool.check()


def test_detects_an_entry_whose_hash_is_not_the_chain() -> None:
    pool, a = _healthy()
    pool.bm.prefix_cache.entry(a.block_ids[1]).token_ids = (9, 9, 9, 9)
    with pytest.raises(BlockInvariantError, match=r"stored hash is not H\(parent"):
        pool.check()


def test_detects_a_block_counted_as_cached_that_is_not() -> None:
    pool, a = _healthy()
    a.num_cached_blocks = 4
    a.num_computed_tokens = 16
    with pytest.raises(BlockInvariantError, match="counted as cached but is not"):
        pool.check()


def test_detects_a_cached_block_at_the_wrong_position() -> None:
    pool, a = _healthy()
    b = pool.new("b", list(range(13)))
    b.block_ids = [a.block_ids[1], a.block_ids[0]]
    for bid in b.block_ids:
        pool.bm.blocks[bid].ref_cnt += 1
    with pytest.raises(BlockInvariantError, match="is not its prefix's block"):
        pool.check()


def test_detects_a_refcount_that_misses_a_holder_of_a_cached_block() -> None:
    pool, a = _healthy()
    b = pool.new("b", list(range(13)))
    pool.admit(b)
    pool.bm.blocks[b.block_ids[0]].ref_cnt -= 1
    with pytest.raises(BlockInvariantError, match="ref_cnt 1 but held by 2"):
        pool.check()


# ------------------------------------------------------------------------ with the scheduler
def test_scheduler_resumes_a_preempted_request_from_its_own_cached_blocks() -> None:
    bm = BlockManager(32, BS, enable_caching=True)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64)
    req = Request("a", list(range(18)), SamplingParams(max_tokens=4), eos_token_id=None)
    sched.add_request(req)
    chunks = []
    while req.num_computed_tokens < req.num_tokens:   # chunked prefill: 8 + 8 + 2
        out = sched.schedule()
        chunks.append(out.scheduled[0].num_new_tokens)
        sched.update_from_output(out, RunnerOutput())
        bm.check_invariants([req])
    assert chunks == [8, 8, 2] and req.num_cached_blocks == 4
    req.append_token(5)
    held = list(req.block_ids)
    sched.preempt(req)
    assert req.block_ids == [] and req.status == RequestStatus.WAITING
    out = sched.schedule()
    # 19 tokens: the 4 full blocks (16 tokens) come back, 3 tokens are recomputed.
    assert req.block_ids[:4] == held[:4] and out.scheduled[0].num_new_tokens == 3
    assert (out.prefix_cache_queries, out.prefix_cache_hits) == (19, 16)
    assert req.num_cached_tokens == 0               # first admission found nothing
    sched.update_from_output(out, RunnerOutput())
    bm.check_invariants([req])
    with pytest.raises(ValueError, match="only a running request can be preempted"):
        sched.preempt(Request("w", [1], SamplingParams(), eos_token_id=None))
