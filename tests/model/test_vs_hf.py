"""pagedllm vs HF transformers on tiny random checkpoints (fp32, CPU).

Greedy tokens must be identical to HF's for a batch of prompts of mixed lengths, whatever
the block size, however the prompts are chunked and however often requests are preempted;
reported logprobs must match HF's log_softmax.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from pagedllm import SamplingParams

MAX_TOKENS = 32
# Lengths straddle block boundaries (16 and 48 are multiples of 16; 17, 31, 33 are not).
PROMPT_LENS = (1, 3, 7, 16, 17, 31, 48, 75)
# Tiny checkpoints: 2 layers x 2 kv heads x head_dim 16, fp32 -> 2*2*2*16*4 bytes/token.
KV_BYTES_PER_TOKEN = 512


def make_prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(2, 512) for _ in range(n)] for n in PROMPT_LENS]


PROMPTS = make_prompts()
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)


@dataclass(frozen=True)
class Planned:
    """One request's share of one step, as scheduled (requests mutate afterwards)."""

    request_id: str
    num_new_tokens: int
    num_computed_tokens: int
    num_prompt_tokens: int

    @property
    def is_prompt_chunk(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens


def record_schedules(llm) -> list[list[Planned]]:
    """Record what the engine's scheduler hands out at every step."""
    sched = llm.llm_engine.scheduler
    steps: list[list[Planned]] = []
    schedule = sched.schedule

    def recording():
        out = schedule()
        steps.append([Planned(s.request.request_id, s.num_new_tokens,
                              s.request.num_computed_tokens, s.request.num_prompt_tokens)
                      for s in out.scheduled])
        return out

    sched.schedule = recording
    return steps


def assert_matches_hf(llm, model_dir, hf_reference, prompts=PROMPTS) -> None:
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, use_tqdm=False)
    assert len(outputs) == len(prompts)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.prompt_token_ids == prompt
        expected, _ = hf_reference.greedy(model_dir, prompt, MAX_TOKENS)
        got = out.outputs[0]
        assert got.token_ids == expected, f"prompt of {len(prompt)} tokens"
        assert got.finish_reason == "length"
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_usable_blocks


def assert_prefix_cached_matches_hf(llm, model_dir, hf_reference) -> None:
    """Prompts sharing a 48-token prefix, then the same prompts again: cache hits, HF's
    tokens every time (`llm` with block_size 8)."""
    long = PROMPTS[-1]
    prompts = [long[:48] + [3 + extra] for extra in (0, 5, 17)]
    for _ in range(2):
        assert_matches_hf(llm, model_dir, hf_reference, prompts)
    assert llm.llm_engine.stats.prefix_cache_hits >= 3 * 48


def assert_logprobs_match_hf(llm, model_dir, hf_reference, prompts, k: int = 5) -> None:
    """Greedy tokens and each step's top-k logprobs within 1e-4 of HF's log-softmax."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=k)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        expected, ref = hf_reference.greedy(model_dir, prompt, MAX_TOKENS)
        assert out.outputs[0].token_ids == expected
        for step, entry in enumerate(out.outputs[0].logprobs):
            top_values, top_ids = ref[step].topk(k)
            assert set(entry) == set(top_ids.tolist())
            for tid, value in zip(top_ids.tolist(), top_values.tolist(), strict=True):
                assert entry[tid].logprob == pytest.approx(value, abs=1e-4), f"step {step}"


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_greedy_batch_matches_hf(arch, request, make_llm, hf_reference) -> None:
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    llm = make_llm(model_dir)
    steps = record_schedules(llm)
    assert_matches_hf(llm, model_dir, hf_reference)
    # One generate call batched everything: all prompts were prefilled in the first step.
    assert len(steps[0]) == len(PROMPTS)


def test_mistral_sliding_window_is_exercised(tiny_mistral_dir, make_llm) -> None:
    llm = make_llm(tiny_mistral_dir)
    assert llm.llm_engine.kv_spec.groups.groups[0].window == 24 < max(PROMPT_LENS)


@pytest.mark.parametrize("block_size", [8, 16, 32, 64])
def test_block_sizes(block_size, tiny_llama_dir, make_llm, hf_reference) -> None:
    llm = make_llm(tiny_llama_dir, block_size=block_size)
    assert_matches_hf(llm, tiny_llama_dir, hf_reference)


def test_chunked_prefill(tiny_llama_dir, make_llm, hf_reference) -> None:
    llm = make_llm(tiny_llama_dir, max_num_batched_tokens=16)
    steps = record_schedules(llm)
    assert_matches_hf(llm, tiny_llama_dir, hf_reference)
    assert max(sum(p.num_new_tokens for p in step) for step in steps) == 16
    # Every prompt was computed in ceil(len / 16) chunks or more ...
    chunks: dict[str, int] = {}
    prompt_lens: dict[str, int] = {}
    for step in steps:
        for p in step:
            if p.is_prompt_chunk:
                chunks[p.request_id] = chunks.get(p.request_id, 0) + 1
                prompt_lens[p.request_id] = p.num_prompt_tokens
    assert sorted(prompt_lens.values()) == sorted(PROMPT_LENS)
    assert all(chunks[rid] >= -(-prompt_lens[rid] // 16) for rid in chunks)
    assert sum(chunks.values()) > len(PROMPTS)
    # ... and some steps mixed prefill chunks with decodes.
    assert any(any(p.is_prompt_chunk for p in step) and any(not p.is_prompt_chunk for p in step)
               for step in steps)


@pytest.mark.parametrize(("block_size", "num_blocks", "budget"), [
    (16, 8, None),       # the pool holds exactly one max_model_len sequence
    (8, 20, 16),         # plus chunked prefill and small blocks
])
def test_preemption(block_size, num_blocks, budget, tiny_llama_dir, make_llm,
                    hf_reference) -> None:
    llm = make_llm(tiny_llama_dir, block_size=block_size, max_model_len=128,
                   max_num_batched_tokens=budget,
                   kv_cache_memory=num_blocks * block_size * KV_BYTES_PER_TOKEN)
    engine = llm.llm_engine
    assert engine.num_blocks == num_blocks
    assert_matches_hf(llm, tiny_llama_dir, hf_reference)
    assert engine.stats.num_preemptions_total > 0


def test_logprobs_match_hf_log_softmax(tiny_llama_dir, make_llm, hf_reference) -> None:
    k = 5
    llm = make_llm(tiny_llama_dir, max_num_batched_tokens=16)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                            logprobs=k)
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        expected_ids, ref = hf_reference.greedy(tiny_llama_dir, prompt, MAX_TOKENS)
        got = out.outputs[0]
        assert got.token_ids == expected_ids
        assert len(got.logprobs) == MAX_TOKENS
        for step, (token, entry) in enumerate(zip(got.token_ids, got.logprobs, strict=True)):
            top_values, top_ids = ref[step].topk(k)
            # The sampled (greedy) token is the top-1, so the entry is exactly the top k.
            assert set(entry) == set(top_ids.tolist()), f"step {step}"
            assert entry[token].rank == 1
            for rank, (tid, value) in enumerate(zip(top_ids.tolist(), top_values.tolist(),
                                                    strict=True), start=1):
                assert entry[tid].logprob == pytest.approx(value, abs=1e-4), f"step {step}"
                assert entry[tid].rank == rank


def test_sampled_logprob_of_non_top_token(tiny_llama_dir, make_llm, hf_reference) -> None:
    """logprobs=0 reports only the sampled token, with its HF logprob and rank, also when a
    high temperature picks a token that is not the argmax."""
    llm = make_llm(tiny_llama_dir)
    prompt = PROMPTS[5]
    _, ref = hf_reference.greedy(tiny_llama_dir, prompt, 1)
    ranks = set()
    for seed in range(8):
        params = SamplingParams(temperature=50.0, max_tokens=1, seed=seed, logprobs=0)
        out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0].outputs[0]
        token = out.token_ids[0]
        assert list(out.logprobs[0]) == [token]
        lp = out.logprobs[0][token]
        assert lp.logprob == pytest.approx(ref[0][token].item(), abs=1e-4)
        assert lp.rank == int((ref[0] >= ref[0][token]).sum())
        ranks.add(lp.rank)
    assert ranks != {1}
