"""Sliding-window KV freeing on the real engine: the tiny random Gemma 3 (window 16 on 3 of
its 4 layers, so 1 full + 3 sliding KV groups of one layer each), sequences up to ~12 windows
long, greedy tokens equal to HF transformers with out-of-window blocks freed, under chunked
prefill, small blocks, recompute and swap preemption and prefix caching; and the tiny
Mistral, whose one window on every layer makes a single sliding group; and n-gram
speculation, whose rejected draft slots are trimmed from every group.

After every step the block manager's (and the swap pool's) invariants hold, and no sliding
table holds a block wholly before the window of the request's next query.
"""

from __future__ import annotations

import pytest

from tests.model.test_gemma3_qwen3_vs_hf import GEMMA_PROMPTS, LONG
from tests.model.test_vs_hf import assert_matches_hf

LONG_PROMPTS = [LONG, LONG[40:] + LONG[:40], *GEMMA_PROMPTS[4:7]]   # 150, 150, 6 ... 48


def watch(llm) -> dict[str, int]:
    """Check invariants and freeing at every step; track the peak of pool bytes in use."""
    engine = llm.llm_engine
    bm, sched, swap = engine.block_manager, engine.scheduler, engine.swap_manager
    seen = {"peak_bytes": 0, "freed_entries": 0, "steps": 0}
    schedule = sched.schedule

    def checked():
        out = schedule()
        bm.check_invariants(sched.requests)
        if swap is not None:
            swap.check_invariants(sched.requests)
        for s in out.scheduled:
            req = s.request
            for group, table in zip(bm.layout.groups, req.block_tables, strict=True):
                first = group.first_useful_block(req.num_computed_tokens, bm.block_size)
                assert all(bm.is_null(b) for b in table[:first]), (req, group, table)
                seen["freed_entries"] += first
        used = bm.num_usable_blocks - bm.num_free_blocks
        seen["peak_bytes"] = max(seen["peak_bytes"], used * engine.kv_spec.bytes_per_block)
        seen["steps"] += 1
        return out

    sched.schedule = checked
    return seen


@pytest.mark.parametrize("block_size", [4, 8])
def test_freeing_matches_hf_and_frees_pool(block_size, tiny_gemma3_dir, make_llm,
                                           hf_reference) -> None:
    llm = make_llm(tiny_gemma3_dir, block_size=block_size, max_num_batched_tokens=24)
    spec = llm.llm_engine.kv_spec
    assert spec.groups.num_groups == 4 and spec.layers_per_block == 1
    seen = watch(llm)
    assert_matches_hf(llm, tiny_gemma3_dir, hf_reference, LONG_PROMPTS)
    assert seen["freed_entries"] > 0
    # Keeping every layer's KV: the same prompts run at the same peak batch would hold
    # 4 layers x all tokens; freeing keeps the full layer's and ~16 tokens per sliding layer.
    keep = make_llm(tiny_gemma3_dir, block_size=block_size, max_num_batched_tokens=24,
                    disable_hybrid_kv_cache_manager=True)
    assert keep.llm_engine.kv_spec.groups.num_groups == 1
    kept = watch(keep)
    assert_matches_hf(keep, tiny_gemma3_dir, hf_reference, LONG_PROMPTS)
    assert kept["freed_entries"] == 0
    assert seen["peak_bytes"] < 0.6 * kept["peak_bytes"], (seen, kept)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_with_freeing(mode, tiny_gemma3_dir, make_llm, hf_reference) -> None:
    # One 192-token sequence computing 32 tokens a step holds 24 full + 3 x 7 sliding blocks
    # of 8 tokens (1 KiB each: one layer); 60 blocks make the 8 prompts preempt each other.
    llm = make_llm(tiny_gemma3_dir, block_size=8, max_model_len=192, max_num_batched_tokens=32,
                   kv_cache_memory=60 * 1024, preemption_mode=mode, swap_space=0.001)
    engine = llm.llm_engine
    assert engine.num_blocks == 60
    seen = watch(llm)
    assert_matches_hf(llm, tiny_gemma3_dir, hf_reference, GEMMA_PROMPTS)
    assert engine.stats.num_preemptions_total > 0 and seen["freed_entries"] > 0
    if mode == "swap":
        assert engine.scheduler.num_swap_outs > 0
        assert engine.swap_manager.num_free_blocks == engine.num_swap_blocks


def test_prefix_caching_with_freeing(tiny_gemma3_dir, make_llm, hf_reference) -> None:
    """Prompts sharing a 4-window prefix, twice: hits bring group 0's blocks and the sliding
    groups' blocks inside the window of the prefix's end; tokens equal HF's every time."""
    llm = make_llm(tiny_gemma3_dir, block_size=4, max_num_batched_tokens=32)
    seen = watch(llm)
    prompts = [LONG[:64 + extra] + [3 + extra] for extra in (0, 5, 17, 40)]
    for _ in range(2):
        assert_matches_hf(llm, tiny_gemma3_dir, hf_reference, prompts)
    engine = llm.llm_engine
    assert engine.stats.prefix_cache_hits >= 4 * 64
    assert len(engine.block_manager.companions) > 0 and seen["freed_entries"] > 0


def test_mistral_sliding_window_frees_blocks_too(tiny_mistral_dir, make_llm,
                                                 hf_reference) -> None:
    """Mistral's one window on every layer: one sliding group (prefix caching needs a
    full-attention group, so it is off, with a warning); greedy tokens equal HF's."""
    from tests.model.test_vs_hf import PROMPTS

    llm = make_llm(tiny_mistral_dir, block_size=4, max_num_batched_tokens=16)
    bm = llm.llm_engine.block_manager
    assert bm.layout.num_groups == 1 and bm.layout.groups[0].window == 24
    assert not bm.enable_caching
    seen = watch(llm)
    assert_matches_hf(llm, tiny_mistral_dir, hf_reference, PROMPTS)
    assert seen["freed_entries"] > 0
    keep = make_llm(tiny_mistral_dir, block_size=4, disable_hybrid_kv_cache_manager=True)
    assert keep.llm_engine.block_manager.enable_caching
    # One table that keeps every block: its spec still carries the window attention applies.
    (group,) = keep.llm_engine.block_manager.layout.groups
    assert group.window == 24 and not group.drops_blocks
    assert_matches_hf(keep, tiny_mistral_dir, hf_reference, PROMPTS)


def test_ngram_speculation_with_freeing(tiny_gemma3_dir, make_llm, hf_reference) -> None:
    """Draft tokens of every group are written and rejected ones trimmed (`trim_slots` on
    all tables); greedy tokens stay HF's."""
    llm = make_llm(tiny_gemma3_dir, block_size=4, max_num_batched_tokens=32,
                   speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    seen = watch(llm)
    repetitive = [LONG[:20] * 4, LONG[:9] * 7]   # n-gram proposals find matches
    assert_matches_hf(llm, tiny_gemma3_dir, hf_reference, [*repetitive, LONG])
    assert seen["freed_entries"] > 0
    spec = llm.llm_engine.stats.speculative
    assert spec.num_draft_tokens > 0 and spec.num_accepted_tokens < spec.num_draft_tokens
