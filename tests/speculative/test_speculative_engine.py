"""Speculative decoding through the real engine on the tiny Llama: greedy output identical to
decoding without it (n-gram k = 1, 3, 5 and draft models), with chunked prefill, preemption
and prefix caching, batched with requests that do not speculate; the block accounting checked
after every step; sampling parameters applied to every emitted token as without it."""

from __future__ import annotations

import random

import pytest

from pagedllm import SamplingParams
from pagedllm.structured_output.params import StructuredOutputsParams

BS = 4
KV_BYTES_PER_TOKEN = 512  # the tiny Llama: 2 layers x 2 x 2 kv heads x 16 x 4 bytes
# 40 blocks x 4 tokens: the batch below does not fit at once, so requests are preempted.
PRESSURE = dict(block_size=BS, max_model_len=96, max_num_batched_tokens=16, max_num_seqs=8,
                kv_cache_memory=40 * BS * KV_BYTES_PER_TOKEN)


def ngram(k: int, **kw) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
            "min_acceptance_rate": 0.0, "disable_by_batch_size": None, **kw}


# Runs of one token after which the tiny Llama falls into loops, some broken now and then
# (found by probing it): n-gram proposals get accepted there, and rejected at the breaks.
LOOPING = [11, 20, 41, 101, 122, 137, 152]


def prompts_and_params(seed: int = 0):
    """Prompts built to repeat (proposals get accepted), random ones (little to propose)
    and a max_tokens=1 one (never speculates); some share a prefix or repeat (cache hits)."""
    rng = random.Random(seed)
    loop = rng.sample(LOOPING, 5)
    prompts = [[loop[0]] * 6, [loop[0]] * 8 + [loop[1]] * 6, [loop[2]] * 7, [loop[3]] * 6,
               [loop[4]] * 9, [loop[2]] * 7]
    prompts += [[rng.randrange(2, 500) for _ in range(rng.randrange(5, 30))] for _ in range(2)]
    prompts += [[loop[0]] * 8 + [7, 8]]
    params = [SamplingParams(temperature=0, max_tokens=rng.randrange(20, 45), ignore_eos=True)
              for _ in prompts]
    params[-1] = SamplingParams(temperature=0, max_tokens=1)
    return prompts, params


def run(llm, prompts, params, check_every_step=True):
    """Drive the engine step by step, checking the block accounting after every step."""
    eng = llm.llm_engine
    ids = [eng.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    done = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                done[out.request_id] = out
        if check_every_step:
            eng.check_invariants()
    eng.check_idle()
    return [done[i] for i in ids]


def tokens(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


@pytest.fixture(scope="module")
def baseline(tiny_llama_dir, make_llm):
    return make_llm(tiny_llama_dir, **PRESSURE)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_ngram_identical(tiny_llama_dir, make_llm, baseline, k):
    prompts, params = prompts_and_params()
    want = tokens(run(baseline, prompts, params, check_every_step=False))
    llm = make_llm(tiny_llama_dir, **PRESSURE, speculative_config=ngram(k))
    got = tokens(run(llm, prompts, params))
    assert got == want
    st = llm.llm_engine.stats
    assert st.speculative.num_accepted_tokens > 0  # speculation really happened
    assert st.speculative.num_accepted_tokens < st.speculative.num_draft_tokens
    assert st.num_preemptions_total > 0 and st.prefix_cache_hits > 0
    if k > 1:
        assert st.speculative.accepted_per_pos[1] > 0


@pytest.mark.parametrize("draft", ["close", "other", "same"])
def test_greedy_draft_model_identical(tiny_llama_dir, close_draft_dir, other_draft_dir,
                                      make_llm, baseline, draft):
    path = {"close": close_draft_dir, "other": other_draft_dir, "same": tiny_llama_dir}[draft]
    prompts, params = prompts_and_params(seed=1)
    want = tokens(run(baseline, prompts, params, check_every_step=False))
    # The same 40 blocks as the baseline: each block also holds the draft's KV.
    draft_bytes = {"close": 512, "other": 128, "same": 512}[draft]
    llm = make_llm(tiny_llama_dir, **PRESSURE | {
        "kv_cache_memory": 40 * BS * (KV_BYTES_PER_TOKEN + draft_bytes)}, speculative_config={
        "method": "draft_model", "model": str(path), "num_speculative_tokens": 3,
        "min_acceptance_rate": 0.0, "disable_by_batch_size": None})
    assert llm.llm_engine.num_blocks == 40
    got = tokens(run(llm, prompts, params))
    assert got == want
    sd = llm.llm_engine.stats.speculative
    assert sd.num_drafts > 0
    if draft == "same":  # the target as its own draft: every greedy draft is right
        assert sd.num_accepted_tokens == sd.num_draft_tokens
    elif draft == "close":
        assert 0 < sd.num_accepted_tokens < sd.num_draft_tokens


def test_seeded_sampling_identical_with_ngram(tiny_llama_dir, make_llm, baseline):
    """n-gram drafts are a point mass: a seeded request draws the same numbers for the same
    tokens, so its output equals the output without speculation."""
    prompts, _ = prompts_and_params(seed=2)
    params = [SamplingParams(temperature=0.7, top_k=20, top_p=0.95, seed=i, max_tokens=30,
                             ignore_eos=True) for i in range(len(prompts))]
    want = tokens(run(baseline, prompts, params, check_every_step=False))
    llm = make_llm(tiny_llama_dir, **PRESSURE, speculative_config=ngram(3))
    assert tokens(run(llm, prompts, params)) == want
    assert llm.llm_engine.stats.speculative.num_accepted_tokens > 0


def test_sampling_parameters_apply_to_every_emitted_token(tiny_llama_dir, make_llm,
                                                          baseline):
    """Penalties, bad words, logit bias, min_tokens with a stop token, stop strings,
    max_tokens, logprobs and a grammar: same tokens, text, finish reasons, logprobs."""
    prompts, _ = prompts_and_params(seed=3)
    probe = run(baseline, prompts[:1], [SamplingParams(temperature=0, max_tokens=30,
                                                       ignore_eos=True)], False)[0]
    out_ids = probe.outputs[0].token_ids
    tok = baseline.get_tokenizer()
    stop_text = tok.decode(out_ids[12:14])
    base = dict(temperature=0, max_tokens=30, ignore_eos=True)
    params = [
        SamplingParams(**base, repetition_penalty=1.3, frequency_penalty=0.4,
                       presence_penalty=0.3),
        SamplingParams(**base, bad_words=[tok.decode(out_ids[3:4])],
                       logit_bias={out_ids[5]: -50.0}),
        SamplingParams(temperature=0, max_tokens=30, min_tokens=8,
                       stop_token_ids=[out_ids[2], out_ids[9]]),
        SamplingParams(**base, stop=[stop_text]),
        SamplingParams(**base | {"max_tokens": 7}, logprobs=3),
        SamplingParams(**base, structured_outputs=StructuredOutputsParams(
            regex=r"(ab|cd)+[0-9]{3,6}x")),
    ]
    prompts = [prompts[0]] * len(params)
    want = run(baseline, prompts, params, check_every_step=False)
    llm = make_llm(tiny_llama_dir, **PRESSURE, speculative_config=ngram(4))
    got = run(llm, prompts, params)
    for w, g in zip(want, got, strict=True):
        wc, gc = w.outputs[0], g.outputs[0]
        assert (gc.token_ids, gc.text, gc.finish_reason, gc.stop_reason) == (
            wc.token_ids, wc.text, wc.finish_reason, wc.stop_reason)
        if wc.logprobs is not None:
            for we, ge in zip(wc.logprobs, gc.logprobs, strict=True):
                assert we.keys() == ge.keys()
                for t in we:
                    assert ge[t].logprob == pytest.approx(we[t].logprob, abs=1e-4)
                    assert ge[t].rank == we[t].rank
    assert llm.llm_engine.stats.speculative.num_accepted_tokens > 0
    assert got[2].outputs[0].finish_reason == "stop" and len(got[2].outputs[0].token_ids) >= 8
    # The grammar-constrained request on its own: its drafts are verified and accepted too.
    solo = make_llm(tiny_llama_dir, **PRESSURE, speculative_config=ngram(4))
    assert tokens(run(solo, prompts[-1:], params[-1:])) == tokens(want[-1:])
    assert solo.llm_engine.stats.speculative.num_accepted_tokens > 0


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_fuzzed_run_keeps_block_invariants(tiny_llama_dir, close_draft_dir, make_llm,
                                           method):
    """Random prompts (some repeating), greedy and seeded sampling, n = 2, stop tokens,
    aborts, preemption and prefix caching; invariants checked after every step."""
    rng = random.Random(5)
    spec = ngram(4) if method == "ngram" else {
        "method": "draft_model", "model": str(close_draft_dir), "num_speculative_tokens": 4,
        "disable_by_batch_size": None}
    kv = 40 * BS * KV_BYTES_PER_TOKEN * (1 if method == "ngram" else 2)
    llm = make_llm(tiny_llama_dir, **PRESSURE | {"max_num_batched_tokens": 12,
                                                 "kv_cache_memory": kv},
                   speculative_config=spec)
    eng = llm.llm_engine
    live: list[str] = []
    for _ in range(160):
        if rng.random() < 0.3:
            unit = [rng.randrange(2, 500) for _ in range(rng.randrange(2, 7))]
            prompt = unit * rng.randrange(1, 5) + [rng.randrange(2, 500)]
            sp = SamplingParams(temperature=rng.choice([0, 0, 0.8]), seed=rng.randrange(99),
                                max_tokens=rng.randrange(1, 40), n=rng.choice([1, 1, 1, 2]),
                                stop_token_ids=[rng.randrange(2, 500)])
            live.append(eng.add_request(prompt[:60], sp))
        if live and rng.random() < 0.05:
            eng.abort_request(live.pop(rng.randrange(len(live))))
        for out in eng.step():
            if out.finished and out.request_id in live:
                live.remove(out.request_id)
        eng.check_invariants()
    while eng.has_unfinished_requests():
        eng.step()
        eng.check_invariants()
    eng.check_idle()
    assert eng.stats.speculative.num_accepted_tokens > 0
    assert eng.stats.num_preemptions_total > 0
