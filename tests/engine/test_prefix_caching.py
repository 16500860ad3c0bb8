"""Prefix caching through the offline API on a tiny random Llama: outputs identical with and
without it, cache_salt isolation, `num_cached_tokens`, the stats counters, the CLI switch."""

from __future__ import annotations

import argparse
import random

import pytest

from pagedllm import SamplingParams
from pagedllm.entrypoints.args import add_engine_args, engine_config_from_args


def shared_prefix_workload(seed: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts cut from one 40-token text at lengths on and off block boundaries, alone (so
    some prompts are exact prefixes of others) or followed by a few tokens of their own;
    greedy and seeded sampling, n = 1 and 2."""
    rng = random.Random(seed)
    base = [rng.randrange(2, 512) for _ in range(40)]
    prompts, params = [], []
    for i, cut in enumerate((1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 40, 40)):
        for own in (0, rng.randint(1, 6)):
            prompts.append(base[:cut] + [rng.randrange(2, 512) for _ in range(own)])
            n = rng.choice([1, 2])
            if (i + own) % 2:
                params.append(SamplingParams(temperature=0.0, n=n, max_tokens=10,
                                             ignore_eos=True))
            else:
                params.append(SamplingParams(temperature=0.8, seed=i, n=n, max_tokens=10))
    order = list(range(len(prompts)))
    rng.shuffle(order)
    return [prompts[i] for i in order], [params[i] for i in order]


def token_ids(outputs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outputs]


def assert_idle(llm) -> None:
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.num_blocks
    engine.check_invariants()


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_outputs_identical_with_and_without_prefix_caching(block_size, tiny_llama_dir,
                                                          make_llm) -> None:
    # A small token budget spreads admissions over steps, so later requests of one batch
    # hit blocks that earlier ones registered; the second wave hits the first's.
    args = dict(block_size=block_size, max_num_batched_tokens=32, max_model_len=128)
    cached = make_llm(tiny_llama_dir, **args)
    plain = make_llm(tiny_llama_dir, enable_prefix_caching=False, **args)
    prompts, params = shared_prefix_workload(seed=block_size)
    half = len(prompts) // 2
    hits = []
    for wave in (slice(0, half), slice(half, None)):
        batch = [{"prompt_token_ids": p} for p in prompts[wave]]
        got = cached.generate(batch, params[wave], use_tqdm=False)
        expected = plain.generate(batch, params[wave], use_tqdm=False)
        assert token_ids(got) == token_ids(expected)
        for prompt, out in zip(prompts[wave], got, strict=True):
            assert out.num_cached_tokens % block_size == 0
            assert out.num_cached_tokens < len(prompt)
        hits.append(sum(o.num_cached_tokens > 0 for o in got))
        assert_idle(cached)
    assert min(hits) > 0 and hits[1] >= half // 2, hits
    assert cached.llm_engine.stats.prefix_cache_hits > 0
    assert plain.llm_engine.stats.prefix_cache_queries == 0


def test_cache_salt_isolates_requests(tiny_llama_dir, make_llm) -> None:
    llm = make_llm(tiny_llama_dir)                     # block_size 16
    prompt = {"prompt_token_ids": list(range(100, 140))}  # 40 tokens: 2 full blocks hit
    greedy = SamplingParams(temperature=0.0, max_tokens=4)

    def cached_tokens(p=prompt, **kw) -> int:
        (out,) = llm.generate(p, greedy, use_tqdm=False, **kw)
        return out.num_cached_tokens

    assert cached_tokens(cache_salt="tenant-a") == 0
    assert cached_tokens(cache_salt="tenant-a") == 32
    assert cached_tokens(cache_salt="tenant-b") == 0
    assert cached_tokens() == 0                        # no salt: its own namespace
    assert cached_tokens() == 32
    assert cached_tokens({**prompt, "cache_salt": "tenant-b"}) == 32
    assert cached_tokens({**prompt, "cache_salt": "tenant-a"}, cache_salt="tenant-b") == 32
    for bad in ("", 7):
        with pytest.raises(ValueError, match="cache_salt must be a non-empty string"):
            llm.generate(prompt, greedy, use_tqdm=False, cache_salt=bad)
    assert_idle(llm)


def test_stats_count_queried_and_hit_tokens(tiny_llama_dir, make_llm) -> None:
    llm = make_llm(tiny_llama_dir, block_size=8)
    engine = llm.llm_engine
    prompt = {"prompt_token_ids": list(range(200, 220))}   # 20 tokens: 2 full blocks
    greedy = SamplingParams(temperature=0.0, max_tokens=3)
    first = llm.generate(prompt, greedy, use_tqdm=False)[0]
    second = llm.generate(prompt, greedy, use_tqdm=False)[0]
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, 16)
    assert first.outputs[0].token_ids == second.outputs[0].token_ids
    st = engine.stats
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (40, 16)
    assert st.prefix_cache_hit_rate == pytest.approx(0.4)
    assert "prefix_cache_hit_rate=40.0%" in st.step_line()


def test_disabled_prefix_caching(tiny_llama_dir, make_llm) -> None:
    llm = make_llm(tiny_llama_dir, enable_prefix_caching=False)
    prompt = {"prompt_token_ids": list(range(100, 140))}
    outs = [llm.generate(prompt, SamplingParams(max_tokens=2), use_tqdm=False)[0]
            for _ in range(2)]
    assert [o.num_cached_tokens for o in outs] == [0, 0]
    engine = llm.llm_engine
    assert engine.block_manager.prefix_cache is None
    assert engine.stats.prefix_cache_queries == 0
    assert "prefix_cache_hit_rate=0.0%" in engine.stats.step_line()


def test_dynamic_rope_turns_prefix_caching_off(tiny_llama_dir, make_llm) -> None:
    # Keys past the original length are rotated for the length their sequence had then.
    llm = make_llm(tiny_llama_dir, rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    engine = llm.llm_engine
    assert not engine.block_manager.enable_caching
    assert not engine.plan.prefix_caching and engine.config.enable_prefix_caching  # as asked


@pytest.mark.parametrize(("argv", "enabled"), [
    ([], True), (["--enable-prefix-caching"], True), (["--no-enable-prefix-caching"], False)])
def test_cli_switch(argv: list[str], enabled: bool) -> None:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(argv))
    assert config.enable_prefix_caching is enabled
