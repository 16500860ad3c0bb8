"""Swap preemption (`preemption_mode="swap"`) on the tiny Llama with a KV pool far smaller than
the working set: outputs equal an unconstrained run (greedy and seeded, n > 1 forks, prefix
cached shared prompts, fp32 and int8 caches), invariants hold after every step (device pool
and swap pool), swaps really happen, and a swap pool that is too small falls back to
recompute with the same outputs."""

from __future__ import annotations

import argparse
import logging
import random

import pytest

from pagedllm import SamplingParams
from pagedllm.config import EngineConfig
from pagedllm.core.request import RequestStatus
from pagedllm.entrypoints.args import add_engine_args, engine_config_from_args

BLOCK_SIZE = 8
MAX_MODEL_LEN = 96
# K and V x 2 layers x 2 KV heads x (16 head_dim x 4 bytes), or x (16 + 2 scale bytes) int8.
BYTES_PER_TOKEN = {"auto": 512, "int8": 144}
GiB = 2**30


def pressure_llm(make_llm, model_dir, kv_cache_dtype="auto", swap_blocks=256, **kw):
    """16 blocks of 8 tokens (128 tokens) for ~14 requests of 30-70 tokens each."""
    block_bytes = BLOCK_SIZE * BYTES_PER_TOKEN[kv_cache_dtype]
    return make_llm(model_dir, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN,
                    max_num_batched_tokens=32, max_num_seqs=8, kv_cache_dtype=kv_cache_dtype,
                    kv_cache_memory=16 * block_bytes, preemption_mode="swap",
                    swap_space=swap_blocks * block_bytes / GiB, **kw)


def workload(seed: int = 0) -> list[tuple[list[int], SamplingParams]]:
    rng = random.Random(seed)
    shared = [rng.randrange(2, 512) for _ in range(2 * BLOCK_SIZE)]  # two cached blocks
    work = []
    for i in range(14):
        own = [rng.randrange(2, 512) for _ in range(rng.randint(5, 30))]
        prompt = shared + own if i % 2 else own
        if i % 3 == 0:
            params = SamplingParams(temperature=0.0, max_tokens=rng.randint(15, 40),
                                    ignore_eos=True)
        else:
            params = SamplingParams(temperature=0.9, seed=i, n=1 + i % 2, logprobs=2,
                                    max_tokens=rng.randint(15, 40), ignore_eos=True)
        work.append((prompt, params))
    return work


def run_checked(llm, work, on_step=None) -> dict[str, list]:
    """Drive the engine step by step, checking invariants after every step."""
    engine = llm.llm_engine
    ids = [engine.add_request(p, params) for p, params in work]
    done: dict[str, list] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = [c.token_ids for c in out.outputs]
        engine.check_invariants()
        if on_step is not None:
            on_step(engine)
        steps += 1
        assert steps < 3000, "no progress"
    assert engine.block_manager.num_free_blocks == engine.num_blocks
    engine.check_invariants()
    return {rid: done[rid] for rid in ids if rid in done}


def reference(make_llm, model_dir, work, kv_cache_dtype="auto") -> list[list]:
    llm = make_llm(model_dir, block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN,
                   kv_cache_dtype=kv_cache_dtype)
    outs = llm.generate([{"prompt_token_ids": p} for p, _ in work], [s for _, s in work],
                        use_tqdm=False)
    return [[c.token_ids for c in o.outputs] for o in outs]


@pytest.mark.parametrize(("kv_cache_dtype", "caching"),
                         [("auto", True), ("int8", True), ("auto", False)])
def test_swapped_requests_match_an_unconstrained_run(tiny_llama_dir, make_llm,
                                                     kv_cache_dtype, caching) -> None:
    work = workload()
    llm = pressure_llm(make_llm, tiny_llama_dir, kv_cache_dtype,
                       enable_prefix_caching=caching)
    engine = llm.llm_engine
    assert engine.swap_manager is not None and engine.cache.swap_pools
    got = run_checked(llm, work)
    st, sched = engine.stats, engine.scheduler
    assert sched.num_swap_outs > 0 and sched.num_swap_outs == sched.num_preemptions
    assert st.swapped_out_blocks_total > 0
    assert st.swapped_in_blocks_total == st.swapped_out_blocks_total
    assert engine.swap_manager.num_free_blocks == engine.num_swap_blocks
    want = reference(make_llm, tiny_llama_dir, work, kv_cache_dtype)
    assert list(got.values()) == want


def test_exhausted_swap_space_falls_back_to_recompute(tiny_llama_dir, make_llm) -> None:
    work = workload(1)
    llm = pressure_llm(make_llm, tiny_llama_dir, swap_blocks=3)
    engine = llm.llm_engine
    peak = [0]

    def watch(engine) -> None:
        peak[0] = max(peak[0], engine.num_swap_blocks - engine.swap_manager.num_free_blocks)

    got = run_checked(llm, work, watch)
    sched = engine.scheduler
    assert engine.num_swap_blocks == 3 and peak[0] <= 3
    assert 0 < sched.num_swap_outs < sched.num_preemptions   # some swapped, some recomputed
    assert list(got.values()) == reference(make_llm, tiny_llama_dir, work)


def test_recompute_mode_allocates_no_swap_space(tiny_llama_dir, make_llm) -> None:
    llm = make_llm(tiny_llama_dir, max_model_len=MAX_MODEL_LEN)
    engine = llm.llm_engine
    assert engine.config.preemption_mode == "recompute" and engine.config.swap_space == 4.0
    assert engine.swap_manager is None and engine.cache.swap_pools == []


def test_abort_while_swapped_and_debug_step_line(tiny_llama_dir, make_llm, caplog) -> None:
    llm = pressure_llm(make_llm, tiny_llama_dir, debug_steps=False)
    engine = llm.llm_engine
    engine.debug_steps = True
    aborted: list[str] = []

    def abort_a_swapped_one(engine) -> None:
        if not aborted and engine.scheduler.swapped:
            victim = engine.scheduler.swapped[-1]
            assert victim.swapped_block_ids and victim.status == RequestStatus.SWAPPED
            engine.abort_request(victim.group_id)
            aborted.append(victim.group_id)
            assert victim.swapped_block_ids == []
            engine.check_invariants()

    with caplog.at_level(logging.INFO, logger="pagedllm.engine.llm_engine"):
        got = run_checked(llm, workload(2), abort_a_swapped_one)
    assert aborted and aborted[0] not in got
    assert engine.swap_manager.num_free_blocks == engine.num_swap_blocks
    lines = [r.getMessage() for r in caplog.records if "swap_out_blocks=" in r.getMessage()]
    assert any("swap_out_blocks=0" not in line for line in lines)
    assert all("swapped=" in line and "swap_in_blocks=" in line for line in lines)


def test_preemption_flags_and_validation() -> None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--preemption-mode", "swap", "--swap-space", "0.5",
                              "--device", "cpu"])
    config = engine_config_from_args(args)
    assert (config.preemption_mode, config.swap_space) == ("swap", 0.5)
    with pytest.raises(ValueError, match="preemption_mode must be one of recompute, swap"):
        EngineConfig(device="cpu", preemption_mode="disk")
    with pytest.raises(ValueError, match="swap_space must be >= 0"):
        EngineConfig(device="cpu", swap_space=-1)
