"""KV groups (full attention + sliding window) in the block manager, swap manager and
scheduler, with no model.

The harness is test_scheduler's fake runner with one fake KV entry per group: every
scheduled token writes (group, position, hash of the tokens up to it) into its slot in each
group's table, and every key a query of the step reads (all earlier positions for a full
group, the last `window` for a sliding one) must read back what was written for exactly that
prefix. So a freed block that was still read, a prefix-cache hit on the wrong blocks, a lost
swap or copy-on-write would all fail. Invariants are checked after every step, and after each
schedule no sliding table holds a block wholly before its window.
"""

from __future__ import annotations

import random

import pytest

from pagedllm.core.block_manager import BlockInvariantError, BlockManager
from pagedllm.core.kv_groups import NULL_BLOCK, KVGroup, KVGroupLayout
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.runner_output import RunnerOutput, SampledTokens
from pagedllm.core.scheduler import Scheduler
from pagedllm.core.scheduler_output import SchedulerOutput
from pagedllm.core.swap_manager import SwapManager
from pagedllm.sampling_params import SamplingParams

BS = 4
WINDOW = 6
FAKE_TOKEN = 7


def gemma_like(num_layers: int = 6, window: int = WINDOW) -> KVGroupLayout:
    return KVGroupLayout.from_windows(
        [None if (i + 1) % 3 == 0 else window for i in range(num_layers)])


def test_layouts_follow_vllm_grouping() -> None:
    gemma270m = KVGroupLayout.from_windows(
        [None if (i + 1) % 6 == 0 else 512 for i in range(18)])
    assert gemma270m.layers_per_block == 3
    assert [g.window for g in gemma270m.groups] == [None] + [512] * 5
    assert gemma270m.groups[0].layers == (5, 11, 17)
    assert gemma270m.groups[1].layers == (0, 1, 2)
    assert gemma270m.slot_of(11) == (0, 1) and gemma270m.slot_of(4) == (2, 1)
    tiny = KVGroupLayout.from_windows([16, 16, None, 16])
    assert tiny.layers_per_block == 1 and tiny.num_groups == 4
    near = KVGroupLayout.from_windows([None] * 5 + [8] * 6)   # 6 < 1.25 x 5: one size, padded
    assert near.layers_per_block == 6 and [len(g.layers) for g in near.groups] == [5, 6]
    mistral = KVGroupLayout.from_windows([24] * 3)
    assert mistral.num_groups == 1 and mistral.frees_blocks
    assert not KVGroupLayout.from_windows([None] * 3).frees_blocks
    # Blocks one sequence holds: full group all, sliding groups their window's.
    assert gemma270m.blocks_per_seq(32768, 16) == 2048 + 5 * 33
    assert KVGroup((0,), 8).first_useful_block(13, 4) == 1     # keys 6.. -> block 1


def test_one_table_keeps_blocks_and_the_common_window() -> None:
    """Every layer in one table (TP, --disable-hybrid-kv-cache-manager): the group keeps all
    its blocks; its window is the layers' common one (attention applies it), else None."""
    mistral = KVGroupLayout.one_table([24] * 4)
    (g,) = mistral.groups
    assert g.window == 24 and not g.drops_blocks and not mistral.frees_blocks
    assert g.first_useful_block(100, 4) == 0 and g.max_blocks(100, 4) == 25
    assert "keeps blocks" in g.kind
    gemma = KVGroupLayout.one_table([16, 16, None, 16])
    assert gemma.groups[0].window is None and not gemma.frees_blocks
    assert KVGroupLayout.from_windows([24] * 4).groups[0].drops_blocks


def test_prefix_caching_needs_a_full_group_zero() -> None:
    with pytest.raises(ValueError, match="prefix caching needs a full-attention KV group 0"):
        BlockManager(8, BS, enable_caching=True, layout=KVGroupLayout.single(2, WINDOW))


def prefix_key(req: Request, pos: int) -> int:
    return hash(tuple(req.all_token_ids[:pos + 1]))


class GroupHarness:
    """Scheduler + grouped block manager + a fake model with per-group fake KV."""

    def __init__(self, *, num_blocks: int = 64, budget: int = 16, max_num_seqs: int = 8,
                 swap_blocks: int | None = None, caching: bool = False,
                 layout: KVGroupLayout | None = None) -> None:
        self.layout = layout or gemma_like()
        self.bm = BlockManager(num_blocks, BS, enable_caching=caching, layout=self.layout)
        self.swap = None if swap_blocks is None else SwapManager(swap_blocks, self.bm)
        self.sched = Scheduler(self.bm, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=budget, max_model_len=1024,
                               swap_manager=self.swap)
        self.kv: dict[int, tuple] = {}
        self.cpu_kv: dict[int, tuple] = {}
        self.all: list[Request] = []
        self.steps: list[SchedulerOutput] = []
        self.peak_used = 0

    def add(self, rid: str, tokens: list[int], max_tokens: int = 4, n: int = 1) -> Request:
        req = Request(rid, tokens, SamplingParams(max_tokens=max_tokens, n=n),
                      eos_token_id=None)
        req.max_tokens = max_tokens
        self.sched.add_request(req)
        self.all.append(req)
        return req

    def check(self) -> None:
        self.bm.check_invariants(self.all)
        if self.swap is not None:
            self.swap.check_invariants(self.all)
        assert all(not any(r.block_tables) for r in self.sched.waiting)

    def step(self) -> SchedulerOutput:
        out = self.sched.schedule()
        self.check()
        for s in out.scheduled:                 # freed as soon as it left the window
            req = s.request
            for group, table in zip(self.layout.groups, req.block_tables, strict=True):
                first = group.first_useful_block(req.num_computed_tokens, BS)
                assert all(b == NULL_BLOCK for b in table[:first]), (req, table)
                assert not any(map(self.bm.is_null, table[first:]))
        self.peak_used = max(self.peak_used, self.bm.num_usable_blocks - self.bm.num_free_blocks)
        self.fake_forward(out)
        sampled = [s.request for s in out.scheduled if s.samples]
        update = self.sched.update_from_output(out, RunnerOutput([   # n > 1 fans out
            SampledTokens(req, [FAKE_TOKEN + len(req.output_token_ids) % 3]
                          * (1 if req.forked else req.sampling_params.n))
            for req in sampled]))
        self.all += update.forked
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
            start, end = req.num_computed_tokens, req.num_computed_tokens + s.num_new_tokens
            for g, (group, table) in enumerate(zip(self.layout.groups, req.block_tables,
                                                   strict=True)):
                for pos in range(start, end):
                    self.kv[table[pos // BS] * BS + pos % BS] = (g, pos, prefix_key(req, pos))
                lo = 0 if group.window is None else max(0, start - group.window + 1)
                for pos in range(lo, end):
                    slot = table[pos // BS] * BS + pos % BS
                    assert self.kv.get(slot) == (g, pos, prefix_key(req, pos)), \
                        f"{req}: group {g} position {pos} reads wrong KV"

    def run(self, max_steps: int = 3000) -> None:
        while self.sched.has_unfinished():
            self.step()
            assert len(self.steps) < max_steps, "no progress"


def test_sliding_groups_free_blocks_that_leave_the_window() -> None:
    h = GroupHarness(num_blocks=200, budget=8)
    req = h.add("long", list(range(100, 160)), max_tokens=40)   # 100 tokens, window 6
    h.run()
    assert req.num_computed_tokens == 99
    # 2 layers a block. Full group: 25 blocks; each of the 2 sliding groups at most
    # cdiv(6 - 1 + 8, 4) + 1 = 5 (while a chunk of 8 is computed), 3 while decoding.
    assert h.layout.layers_per_block == 2 and h.layout.num_groups == 3
    assert 25 + 2 * 2 <= h.peak_used <= 25 + 2 * 5
    no_freeing = GroupHarness(num_blocks=200, budget=8, layout=KVGroupLayout.single(6))
    no_freeing.add("long", list(range(100, 160)), max_tokens=40)
    no_freeing.run()
    assert no_freeing.peak_used == 25   # 6 layers a block: 150 layer-blocks against <= 70
    assert h.bm.num_free_blocks == h.bm.num_usable_blocks == 199


def test_free_out_of_window_is_idempotent_and_keeps_the_window() -> None:
    bm = BlockManager(64, BS, layout=gemma_like())
    req = Request("r", list(range(30)), SamplingParams(), eos_token_id=None)
    assert bm.allocate_slots(req, 30)
    req.num_computed_tokens = 30
    assert [len(t) for t in req.block_tables] == [8, 8, 8]
    assert bm.free_out_of_window(req) == 2 * 6   # keys 25.. -> blocks 6, 7 stay
    assert bm.free_out_of_window(req) == 0
    assert req.block_tables[1][:6] == [NULL_BLOCK] * 6 and NULL_BLOCK not in req.block_ids
    bm.check_invariants([req])
    bm.free(req)
    assert bm.num_free_blocks == 63


def test_invariants_catch_a_freed_block_inside_the_window() -> None:
    bm = BlockManager(64, BS, layout=gemma_like())
    req = Request("r", list(range(30)), SamplingParams(), eos_token_id=None)
    bm.allocate_slots(req, 30)
    req.num_computed_tokens = 30
    bm.free_out_of_window(req)
    bm._release(req.block_tables[1][6])           # noqa: SLF001 - corrupt on purpose
    req.block_tables[1][6] = NULL_BLOCK
    with pytest.raises(BlockInvariantError, match="inside the window was freed"):
        bm.check_invariants([req])


@pytest.mark.parametrize("swap_blocks", [None, 6, 64])
def test_pressure_with_forks_preemption_and_swap(swap_blocks) -> None:
    """A small pool under random load: recompute and swap preemption, n = 2 forks with
    copy-on-write, all with per-group tables; the fake KV proves every read."""
    rng = random.Random(3 if swap_blocks is None else swap_blocks)
    h = GroupHarness(num_blocks=40, budget=10, max_num_seqs=6, swap_blocks=swap_blocks)
    parents = []
    for i in range(14):
        n = 2 if i % 4 == 0 else 1
        req = h.add(f"r{i}", [rng.randrange(50) for _ in range(rng.randint(1, 30))],
                    max_tokens=rng.randint(2, 24), n=n)
        if n > 1:
            parents.append(req)
    while h.sched.has_unfinished():
        h.step()
        assert len(h.steps) < 3000
    assert all(p.forked for p in parents)
    assert len(h.all) == 14 + len(parents)
    assert h.sched.num_preemptions > 0
    if swap_blocks:
        assert h.sched.num_swap_outs > 0
    assert all(r.status == RequestStatus.FINISHED_LENGTH for r in h.all)
    assert h.bm.num_free_blocks == h.bm.num_usable_blocks


def test_prefix_cache_hits_bring_each_groups_blocks() -> None:
    """Requests sharing a long prefix, one after another: the hit takes group 0's blocks
    and, for the sliding groups, only the blocks inside the window of the prefix's end
    (the rest are NULL_BLOCK); the fake KV proves the reused blocks hold that prefix."""
    rng = random.Random(5)
    prefix = [rng.randrange(50) for _ in range(37)]
    h = GroupHarness(num_blocks=120, budget=16, caching=True)
    first = h.add("a", prefix + [1, 2], max_tokens=3)
    h.run()
    hit_blocks = []
    for i, tail in enumerate([[3], [4, 5, 6, 7, 8], list(range(20))]):
        req = h.add(f"b{i}", prefix + tail, max_tokens=5)
        h.step()
        hit_blocks.append(req.num_cached_tokens)
        sliding = req.block_tables[1]
        first_useful = h.layout.groups[1].first_useful_block(req.num_cached_tokens, BS)
        assert sliding[:first_useful] == [NULL_BLOCK] * first_useful
        h.run()
    assert first.num_cached_tokens == 0
    assert hit_blocks == [36, 36, 36]   # 9 full blocks of the 37-token prefix
    assert h.bm.num_free_blocks == h.bm.num_usable_blocks


def test_prefix_cache_hit_shrinks_when_a_sliding_block_was_evicted() -> None:
    bm = BlockManager(40, BS, enable_caching=True, layout=gemma_like())
    a = Request("a", list(range(20)), SamplingParams(), eos_token_id=None)
    assert bm.allocate_slots(a, 20)
    a.num_computed_tokens = 20
    bm.cache_full_blocks(a)
    assert len(bm.companions) == 10   # five blocks of each sliding group, beside group 0
    bm.free(a)
    b = Request("b", list(range(20)) + [99], SamplingParams(), eos_token_id=None)
    assert len(bm.get_computed_blocks(b)) == 5
    # Evict group 1's companion of block 4 (the window's last block): the hit must shrink
    # to a prefix whose window blocks are all still cached.
    last_companion = next(blk for blk, (g, full) in bm.companions.owner.items()
                          if g == 1 and full == bm.prefix_cache.lookup(b)[4])
    bm.free_queue.move_to_end(last_companion, last=False)
    taken = bm.take_blocks(1)   # takes (evicts) exactly that block
    assert taken == [last_companion]
    bm._release(taken[0])   # noqa: SLF001 - give it back, uncached
    hits = bm.get_computed_blocks(b)
    assert len(hits) == 4   # window 6 at 16 tokens reads blocks 2, 3: still cached
    assert bm.allocate_slots(b, 5, hits)
    assert b.block_tables[1][:2] == [NULL_BLOCK] * 2 and NULL_BLOCK not in b.block_tables[1][2:]
    b.num_computed_tokens = 16
    a.status = RequestStatus.FINISHED_STOPPED
    bm.check_invariants([a, b])
