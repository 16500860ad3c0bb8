"""int8 / fp8 KV caches end to end on a tiny random Llama: greedy tokens and logprobs close
to the unquantized cache, and the same outputs whatever moves blocks around (copy-on-write
forks, prefix-cache hits, preemption)."""

from __future__ import annotations

import argparse

import pytest
import torch

from pagedllm import SamplingParams
from pagedllm.config import EngineConfig
from pagedllm.entrypoints.args import add_engine_args, engine_config_from_args

PROMPTS = ["Hello, my name is", "The quick brown fox", "def f(x):", "In the beginning",
           "1 2 3 4", "Once upon a time", "class A:", "The"]
GREEDY16 = SamplingParams(temperature=0.0, max_tokens=16, logprobs=5, ignore_eos=True)
NEAR_TIE = 0.05   # logprob gap under which a flipped greedy choice is not an error


@pytest.fixture(scope="module")
def auto_outputs(tiny_llama_dir, make_llm):
    return make_llm(tiny_llama_dir).generate(PROMPTS, GREEDY16, use_tqdm=False)


def _agreement(ref, got) -> tuple[int, float, float | None]:
    """(tokens identical before the first difference, max |logprob difference| of the
    reference's tokens up to there, the reference's gap between the two tokens there)."""
    a, b = ref.outputs[0], got.outputs[0]
    n = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=True))
              if x != y),
             len(a.token_ids))
    diff = max((abs(a.logprobs[i][t].logprob - b.logprobs[i][t].logprob)
                for i, t in enumerate(a.token_ids[:n])), default=0.0)
    gap = None
    if n < len(a.token_ids):
        other = a.logprobs[n].get(b.token_ids[n])
        gap = a.logprobs[n][a.token_ids[n]].logprob - (other.logprob if other else -1e9)
    return n, diff, gap


def test_int8_greedy_tokens_and_logprobs_match_auto(tiny_llama_dir, make_llm,
                                                     auto_outputs) -> None:
    """Same 16 greedy tokens on most prompts; a difference only where the unquantized run
    itself had a near tie; logprobs of the shared tokens within 0.1."""
    outs = make_llm(tiny_llama_dir, kv_cache_dtype="int8").generate(PROMPTS, GREEDY16,
                                                                     use_tqdm=False)
    full = 0
    for ref, got in zip(auto_outputs, outs, strict=True):
        n, diff, gap = _agreement(ref, got)
        assert diff < 0.1, (ref.prompt, diff)
        if gap is None:
            full += 1
        else:
            assert gap < NEAR_TIE, (ref.prompt, n, gap)
    assert full >= 5, full


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2"])
def test_fp8_first_token_close_to_auto(tiny_llama_dir, make_llm, auto_outputs,
                                       kv_cache_dtype) -> None:
    """fp8 loses more (e4m3 keeps 3 mantissa bits, e5m2 2): the first token (prefill over
    the quantized prompt) has close logprobs; SmolLM2's perplexity is in the benchmark."""
    llm = make_llm(tiny_llama_dir, kv_cache_dtype=kv_cache_dtype)
    assert llm.llm_engine.cache.kv.dtype == {"fp8": torch.float8_e4m3fn,
                                             "fp8_e5m2": torch.float8_e5m2}[kv_cache_dtype]
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=1, logprobs=5),
                        use_tqdm=False)
    for ref, got in zip(auto_outputs, outs, strict=True):
        a, b = ref.outputs[0], got.outputs[0]
        t = a.token_ids[0]
        if b.token_ids[0] == t:
            assert abs(a.logprobs[0][t].logprob - b.logprobs[0][t].logprob) < 0.3
        else:
            assert a.logprobs[0][t].logprob - a.logprobs[0][b.token_ids[0]].logprob < 0.3


def test_n_greedy_forks_copy_scales(tiny_llama_dir, make_llm) -> None:
    """n = 3 greedy samples fork a prompt that ends mid-block: the copy-on-write copies
    must carry the scales, or the forks would read zero-scaled (all-zero) prompt K/V."""
    llm = make_llm(tiny_llama_dir, kv_cache_dtype="int8")
    prompt = {"prompt_token_ids": list(range(200, 237))}      # 37 tokens: block 2 partial
    single = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=20),
                          use_tqdm=False)[0].outputs[0].token_ids
    copies = []
    runner = llm.llm_engine.runner
    execute = runner.execute
    runner.execute = lambda sched: copies.extend(sched.blocks_to_copy) or execute(sched)
    (out,) = llm.generate(prompt, SamplingParams(n=3, temperature=0.0, max_tokens=20),
                          use_tqdm=False)
    assert copies, "the forks should have copied the shared partial block"
    assert [c.token_ids for c in out.outputs] == [single] * 3
    llm.llm_engine.check_invariants()
    assert llm.llm_engine.block_manager.num_free_blocks == llm.llm_engine.num_blocks


def test_prefix_cache_hits_give_the_same_outputs(tiny_llama_dir, make_llm) -> None:
    """Blocks shared through the prefix cache come with their scales (same block ids)."""
    shared = list(range(300, 340))                              # 2 full blocks of 16 + 8
    prompts = [{"prompt_token_ids": shared + [i, i + 1, i + 2]} for i in range(50, 56)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    cached = make_llm(tiny_llama_dir, kv_cache_dtype="int8")
    plain = make_llm(tiny_llama_dir, kv_cache_dtype="int8", enable_prefix_caching=False)
    first = cached.generate(prompts[:1], params, use_tqdm=False)
    got = cached.generate(prompts[1:], params, use_tqdm=False)
    assert all(o.num_cached_tokens == 32 for o in got)
    expected = plain.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in first + got] == [
        o.outputs[0].token_ids for o in expected]
    cached.llm_engine.check_invariants()


def test_preemption_gives_the_same_outputs(tiny_llama_dir, make_llm) -> None:
    """A pool of 16 blocks of 8 int8 tokens forces preemption (recompute); outputs equal an
    unconstrained int8 run and the block accounting stays consistent every step."""
    prompts = [f"{w} " * 6 for w in ("alpha", "beta", "gamma", "delta", "eps", "zeta")]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    roomy = make_llm(tiny_llama_dir, kv_cache_dtype="int8", block_size=8)
    expected = [o.outputs[0].token_ids for o in roomy.generate(prompts, params,
                                                               use_tqdm=False)]
    spec_bytes = roomy.llm_engine.kv_spec.bytes_per_block                 # 8 x 144 bytes
    tight = make_llm(tiny_llama_dir, kv_cache_dtype="int8", block_size=8, max_model_len=128,
                     max_num_batched_tokens=16, kv_cache_memory=16 * spec_bytes)
    engine = tight.llm_engine
    assert engine.num_blocks == 16
    for i, p in enumerate(prompts):
        engine.add_request(p, params, request_id=str(i))
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out.outputs[0].token_ids
        engine.check_invariants()
    assert engine.stats.num_preemptions_total > 0
    assert [done[str(i)] for i in range(len(prompts))] == expected


def test_kv_cache_dtype_config_and_cli() -> None:
    assert EngineConfig(kv_cache_dtype="fp8").torch_kv_cache_dtype == torch.float8_e4m3fn
    assert EngineConfig(kv_cache_dtype="fp8_e5m2").torch_kv_cache_dtype == torch.float8_e5m2
    assert EngineConfig(kv_cache_dtype="int8").torch_kv_cache_dtype == torch.int8
    assert EngineConfig(kv_cache_dtype="auto", device="cpu").torch_kv_cache_dtype == (
        torch.float32)
    assert EngineConfig(kv_cache_dtype="fp16").torch_kv_cache_dtype == torch.float16
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float32"):
        EngineConfig(kv_cache_dtype="int4")
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    config = engine_config_from_args(parser.parse_args(["--kv-cache-dtype", "int8"]))
    assert config.kv_cache_dtype == "int8"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp4"])


@pytest.mark.parametrize(("kv", "int8_acts", "block_quantized", "expected"), [
    ("auto", True, True, torch.float16),     # the fast path: float16 K/V
    ("auto", False, True, torch.float32),    # the exact path: the model dtype
    ("auto", True, False, torch.float32),    # an all-float GGUF: exact matrices
    ("float32", True, True, torch.float32),  # fp32 K/V asked for on the fast path
    ("int8", True, True, torch.int8),
])
def test_kv_cache_dtype_auto_follows_int8_activations(kv, int8_acts, block_quantized,
                                                      expected) -> None:
    """'auto' stores float16 K/V under fp32 compute where the matrices run int8 activations
    (settled with them, before the KV spec is made), the model dtype elsewhere."""
    config = EngineConfig(kv_cache_dtype=kv, device="cpu", int8_activations=int8_acts)
    assert config.torch_kv_cache_dtype == KV_DTYPE_BEFORE[kv]
    config.resolve_int8_activations(gguf=True, block_quantized=block_quantized)
    assert config.torch_kv_cache_dtype == expected


KV_DTYPE_BEFORE = {"auto": torch.float32, "float32": torch.float32, "int8": torch.int8}
