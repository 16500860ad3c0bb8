"""The prefix-cache fuzz (test_prefix_cache_fuzz.py: random adds sharing prefixes, n > 1,
salts, steps, aborts, forced preemptions, runner failures) on the tiny Gemma 3, whose
sliding layers keep block tables of their own and free what leaves the window of 16.

The fake runner checks every group's KV: each scheduled token writes (group, its prefix's
fingerprint) into its slot in every group's table, and every key a query of the step reads
(all earlier positions for the full group, the last 16 for a sliding one) must hold exactly
that, so a block freed while still read, a hit on the wrong companion blocks or a lost
copy-on-write fails at once. Block invariants are checked after every operation.
"""

from __future__ import annotations

import random

from tests.engine.test_prefix_cache_fuzz import BS, FakeRunner, Fuzzer, make_engine


class GroupFakeRunner(FakeRunner):
    """FakeRunner over per-group block tables: a group reads only the positions its window
    sees, and each slot holds (group, fingerprint)."""

    def __init__(self, layout, num_blocks: int, rng: random.Random) -> None:
        super().__init__(num_blocks, rng)
        self.layout = layout

    def attend_and_write(self, req, start: int, end: int, fps: list[int]) -> None:
        for g, (group, table) in enumerate(zip(self.layout.groups, req.block_tables,
                                               strict=True)):
            slots = [table[p // BS] * BS + p % BS for p in range(end)]
            lo = 0 if group.window is None else max(0, start - group.window + 1)
            for p in range(lo, start):
                assert self.kv[slots[p]] == (g, fps[p]), f"{req}: group {g} position {p}"
            for p in range(start, end):
                self.kv[slots[p]] = (g, fps[p])


def test_fuzz_with_sliding_window_groups(tiny_gemma3_dir, make_llm) -> None:
    rng = random.Random(4321)
    # one decode step at a time: the fake runner samples one token a scheduled request (runs
    # of several steps would be cut to one every time, and their blocks, handed out and given
    # back each step, would keep the pool from the pressure that preempts)
    engine = make_engine(make_llm, tiny_gemma3_dir, num_scheduler_steps=1).llm_engine
    bm = engine.block_manager
    assert bm.enable_caching and bm.layout.num_groups == 4 and bm.layout.frees_blocks
    engine.runner = GroupFakeRunner(bm.layout, bm.num_blocks, rng)
    freed = [0]
    free_out_of_window = bm.free_out_of_window

    def counting(req):
        n = free_out_of_window(req)
        freed[0] += n
        return n

    bm.free_out_of_window = counting
    fuzz = Fuzzer(engine, rng)
    for _ in range(4000):
        fuzz.random_op(failures=True)
    fuzz.drain()
    fuzz.assert_no_ghost_blocks()
    st = engine.stats
    assert min(fuzz.counts.values()) > 0, fuzz.counts
    assert st.prefix_cache_hits > 0.1 * st.prefix_cache_queries
    assert engine.scheduler.num_preemptions > fuzz.counts["preempt"]
    assert freed[0] > 0 and len(bm.companions) > 0
