"""No ghost blocks: random adds (sharing random prefixes, n > 1, salts), steps, aborts, forced
preemptions, runner failures and finishes, with the block accounting checked after every
operation and every block free (or cached with refcount 0) at the end.

The long fuzz runs the real `LLMEngine` (scheduler, block manager, output processing, stop
checks, fan-out) with a fake model runner that checks the KV every request reads, so a
wrong cache hit or a lost copy-on-write fails at once; a shorter one runs the tiny model and
compares its outputs with prefix caching off.
"""

from __future__ import annotations

import random

import pytest

from pagedllm import SamplingParams
from pagedllm.core.request import RequestStatus
from pagedllm.core.runner_output import RunnerOutput, SampledTokens

BS = 4
MAX_MODEL_LEN = 64
NUM_BLOCKS = 24                 # 96 token slots: constant pressure, frequent preemption
KV_BYTES_PER_TOKEN = 512        # tiny checkpoints (see tests/model/test_vs_hf.py)


def make_engine(make_llm, model_dir, **overrides):
    args = dict(block_size=BS, max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=24,
                max_num_seqs=6, kv_cache_memory=NUM_BLOCKS * BS * KV_BYTES_PER_TOKEN)
    return make_llm(model_dir, **(args | overrides))


def fingerprints(token_ids: list[int]) -> list[int]:
    """fp[p] identifies token_ids[:p + 1]: what the KV at position p depends on."""
    fps, h = [], 0
    for t in token_ids:
        h = hash((h, t))
        fps.append(h)
    return fps


class FakeRunner:
    """Stands in for ModelRunner. "Computing" a token writes its prefix's fingerprint into its
    slot; every slot a scheduled request attends to must hold its own prefix's fingerprint.
    Greedy requests sample from the fingerprint alone, so equal prefixes generate equal
    blocks (duplicates for the cache to collapse); others sample at random, EOS included."""

    def __init__(self, num_blocks: int, rng: random.Random) -> None:
        self.kv: list[int | None] = [None] * (num_blocks * BS)
        self.rng = rng
        self.fail_next = False

    def execute(self, sched) -> RunnerOutput:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("injected runner failure")
        for src, dst in sched.blocks_to_copy:
            self.kv[dst * BS:(dst + 1) * BS] = self.kv[src * BS:(src + 1) * BS]
        out = RunnerOutput()
        for s in sched.scheduled:
            req = s.request
            start, end = req.num_computed_tokens, req.num_computed_tokens + s.num_new_tokens
            fps = fingerprints(req.all_token_ids[:end])
            self.attend_and_write(req, start, end, fps)
            if s.samples:
                n = 1 if req.forked else req.sampling_params.n
                if req.sampling_params.temperature == 0:
                    toks = [2 + fps[end - 1] % 5] * n
                else:
                    toks = [1 if self.rng.random() < 0.04 else self.rng.randrange(2, 7)
                            for _ in range(n)]
                out.sampled.append(SampledTokens(req, toks))
        return out


    def attend_and_write(self, req, start: int, end: int, fps: list[int]) -> None:
        """Positions before `start` must hold their prefix's fingerprint; write the rest."""
        slots = [req.block_ids[p // BS] * BS + p % BS for p in range(end)]
        for p in range(start):
            assert self.kv[slots[p]] == fps[p], f"{req}: wrong KV at position {p}"
        for p in range(start, end):
            self.kv[slots[p]] = fps[p]


class Fuzzer:
    """Random operations against one engine, with the block accounting checked after each."""

    def __init__(self, engine, rng: random.Random, *, seeded: bool = False) -> None:
        self.engine = engine
        self.rng = rng
        self.seeded = seeded            # real model: sampling requests need seeds to compare
        self.prefixes = [[rng.randrange(2, 512) for _ in range(n)]
                         for n in (0, 3, 4, 5, 8, 11, 16, 23)]
        self.history: list[list[int]] = []
        self.live: set[str] = set()
        self.requests: dict[str, tuple[list[int], SamplingParams, str | None]] = {}
        self.finished: dict[str, object] = {}
        self.aborted: set[str] = set()
        self.seqs: dict[int, object] = {}
        self.done_seqs: list = []
        self.counts = dict.fromkeys(("add", "step", "abort", "preempt", "fail"), 0)

    # ---------------------------------------------------------------- ops
    def prompt(self) -> list[int]:
        rng = self.rng
        if self.history and rng.random() < 0.2:   # an exact prefix of an earlier prompt
            base = rng.choice(self.history)
            return base[:rng.randint(1, len(base))]
        suffix = [rng.randrange(2, 512) for _ in range(rng.randint(0, 9))]
        return (rng.choice(self.prefixes) + suffix) or [rng.randrange(2, 512)]

    def add(self) -> None:
        rng = self.rng
        prompt = self.prompt()
        self.history.append(prompt)
        temperature = rng.choice([0.0, 1.0])
        params = SamplingParams(
            n=rng.choice([1, 1, 1, 2, 3]), temperature=temperature,
            max_tokens=rng.randint(1, 16), ignore_eos=rng.random() < 0.5,
            seed=rng.randrange(1000) if self.seeded and temperature else None)
        salt = rng.choice([None, None, None, "tenant-a", "tenant-b"])
        rid = self.engine.add_request(prompt, params, cache_salt=salt)
        self.requests[rid] = (prompt, params, salt)
        self.live.add(rid)

    def step(self) -> None:
        for out in self.engine.step():
            if out.finished:
                self.live.discard(out.request_id)
                self.finished[out.request_id] = out

    def abort(self, rid: str) -> None:
        self.engine.abort_request(rid)
        self.live.discard(rid)
        self.aborted.add(rid)

    def preempt(self) -> None:
        running = self.engine.scheduler.running
        if running:
            self.engine.scheduler.preempt(self.rng.choice(running))

    def fail_step(self) -> None:
        """The forward pass raises: callers (LLM, AsyncEngine) abort everything in flight."""
        if not self.engine.has_unfinished_requests():
            self.add()
        self.engine.runner.fail_next = True
        with pytest.raises(RuntimeError, match="injected"):
            self.engine.step()
        for rid in list(self.live):
            self.abort(rid)

    def random_op(self, *, failures: bool) -> None:
        r = self.rng.random()
        if r < 0.30:
            op = "add"
            self.add()
        elif r < 0.75:
            op = "step"
            self.step()
        elif r < 0.85:
            op = "abort"
            if self.live:
                self.abort(self.rng.choice(sorted(self.live)))
        elif r < 0.99 or not failures:
            op = "preempt"
            self.preempt()
        else:
            op = "fail"
            self.fail_step()
        self.counts[op] += 1
        self.check()

    # ---------------------------------------------------------------- checks
    def check(self) -> None:
        eng = self.engine
        for group in eng.output_processor.groups.values():
            for seq in group.seqs:
                self.seqs[id(seq)] = seq
        # Sequences that finished since the last check are included: they must hold nothing
        # (and can never take blocks again, so they are checked once).
        eng.block_manager.check_invariants(self.seqs.values())
        for key in [k for k, seq in self.seqs.items() if seq.is_finished]:
            self.done_seqs.append(self.seqs.pop(key))
        eng.check_invariants()
        sched = eng.scheduler
        assert all(r.status == RequestStatus.RUNNING for r in sched.running)
        assert all(r.status == RequestStatus.WAITING and not r.block_ids
                   and r.num_computed_tokens == 0 for r in sched.waiting)
        assert len({id(r) for r in sched.requests}) == len(sched.requests)

    def drain(self) -> None:
        """Abort half of what is left, run the rest to completion."""
        for rid in sorted(self.live)[::2]:
            self.abort(rid)
        self.check()  # the aborted sequences must be seen finished even if nothing is left
        steps = 0
        while self.engine.has_unfinished_requests():
            self.step()
            self.check()
            steps += 1
            assert steps < 5000, "no progress"
        assert not self.live

    def assert_no_ghost_blocks(self) -> None:
        bm = self.engine.block_manager
        assert bm.num_free_blocks == bm.num_usable_blocks
        assert all(b.ref_cnt == 0 for b in bm.blocks)
        assert not self.seqs
        assert all(s.is_finished and not s.block_ids for s in self.done_seqs)
        assert self.engine.output_processor.groups == {}


def test_fuzz_ten_thousand_ops_with_a_fake_runner(tiny_llama_dir, make_llm) -> None:
    rng = random.Random(1234)
    engine = make_engine(make_llm, tiny_llama_dir).llm_engine
    bm = engine.block_manager
    assert bm.enable_caching and bm.num_blocks == NUM_BLOCKS
    engine.runner = FakeRunner(bm.num_blocks, rng)

    evicted, swapped = [], [0]
    evict, cache_full_blocks = bm.prefix_cache.evict, bm.cache_full_blocks

    def counting_evict(block_id):
        gone = evict(block_id)
        evicted.extend(gone)
        return gone

    def counting_cache_full_blocks(req):
        before = list(req.block_ids)
        cache_full_blocks(req)
        swapped[0] += sum(a != b for a, b in zip(before, req.block_ids, strict=True))

    bm.prefix_cache.evict = counting_evict
    bm.cache_full_blocks = counting_cache_full_blocks

    fuzz = Fuzzer(engine, rng)
    for _ in range(10_000):
        fuzz.random_op(failures=True)
    fuzz.drain()
    fuzz.assert_no_ghost_blocks()
    assert len(bm.prefix_cache) > 0               # cached blocks survive, refcount 0, free
    assert all(bm.blocks[e.block_id].ref_cnt == 0 and e.block_id in bm.free_queue
               for e in bm.prefix_cache.entries.values())

    # The run exercised what it is meant to.
    st = engine.stats
    assert min(fuzz.counts.values()) > 0, fuzz.counts
    assert st.prefix_cache_hits > 0.1 * st.prefix_cache_queries
    assert engine.scheduler.num_preemptions > fuzz.counts["preempt"]  # also from pressure
    assert evicted and swapped[0] > 0
    assert any(len(o.outputs) > 1 for o in fuzz.finished.values())
    assert {o.outputs[0].finish_reason for o in fuzz.finished.values()} == {"stop", "length"}
    assert any(o.num_cached_tokens for o in fuzz.finished.values())


def test_fuzz_real_engine_matches_no_caching(tiny_llama_dir, make_llm) -> None:
    rng = random.Random(99)
    llm = make_engine(make_llm, tiny_llama_dir)
    engine = llm.llm_engine
    fuzz = Fuzzer(engine, rng, seeded=True)
    for _ in range(600):
        fuzz.random_op(failures=False)
    fuzz.drain()
    fuzz.assert_no_ghost_blocks()
    assert engine.stats.prefix_cache_hits > 0 and engine.scheduler.num_preemptions > 0

    # Every request that finished on its own gives what it gives without prefix caching.
    done = [rid for rid in fuzz.finished if rid not in fuzz.aborted]
    assert len(done) > 20
    plain = make_llm(tiny_llama_dir, max_model_len=MAX_MODEL_LEN, block_size=BS,
                     enable_prefix_caching=False)
    ref = plain.generate([{"prompt_token_ids": fuzz.requests[r][0]} for r in done],
                         [fuzz.requests[r][1] for r in done], use_tqdm=False)
    for rid, expected in zip(done, ref, strict=True):
        got = fuzz.finished[rid]
        assert [c.token_ids for c in got.outputs] == [c.token_ids for c in expected.outputs], rid
