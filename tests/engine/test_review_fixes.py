"""Regression tests for the bugs a review found (issue 17): stop strings before min_tokens,
the engine seed, the waiting gauge, cumulative_logprob / decoded_token, and output lists
shared with the engine thread. Each failed before its fix."""

from __future__ import annotations

import pytest

from pagedllm import SamplingParams
from pagedllm.core.request import RequestStatus
from pagedllm.engine.stats import snapshot_of


@pytest.fixture(scope="module")
def llm(tiny_llama_dir, make_llm):
    return make_llm(tiny_llama_dir, max_model_len=256)


def _gen(llm, prompt, params):
    return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]


def test_stop_strings_are_checked_only_after_min_tokens(llm) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    full = _gen(llm, "Hello", greedy)
    tok = llm.get_tokenizer()
    early = tok.decode(full.token_ids[:3])
    stop = early.strip()[-2:] or early[-2:]
    assert stop and stop in full.text
    # Without min_tokens the stop string ends the output within its first 3 tokens ...
    cut = _gen(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                                            stop=[stop]))
    assert cut.finish_reason == "stop" and len(cut.token_ids) <= 3
    # ... with min_tokens=8 (vLLM) the text of those first 8 tokens is never searched.
    later = _gen(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True,
                                              stop=[stop], min_tokens=8))
    assert len(later.token_ids) > 8
    assert later.token_ids == full.token_ids[:len(later.token_ids)]


def test_engine_seed_makes_unseeded_sampling_reproducible(tiny_llama_dir, make_llm) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    prompts = ["Hello", "The capital of France is", "Once upon"]

    def run(seed: int) -> list[list[int]]:
        llm = make_llm(tiny_llama_dir, max_model_len=128, seed=seed)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    first = run(5)
    assert run(5) == first  # a fresh engine with the same seed samples the same tokens
    assert run(6) != first


def test_waiting_gauge_counts_requests_not_sequences(llm) -> None:
    eng = llm.llm_engine
    eng.add_request("Hello", SamplingParams(n=4, temperature=1.0, max_tokens=8), "g")
    eng.step()  # prefill + first token: the request fans out into 4 running sequences
    assert len(eng.scheduler.running) == 4 and snapshot_of(eng).running == 1
    for seq in list(eng.scheduler.running):
        eng.scheduler.preempt(seq)
    assert len(eng.scheduler.waiting) == 4
    snap = snapshot_of(eng)
    assert (snap.running, snap.waiting) == (0, 1)
    eng.abort_request("g")
    assert not eng.has_unfinished_requests()


def test_cumulative_logprob_and_decoded_token(llm) -> None:
    tok = llm.get_tokenizer()
    out = _gen(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=8, logprobs=3))
    assert out.cumulative_logprob == pytest.approx(
        sum(e[t].logprob for e, t in zip(out.logprobs, out.token_ids, strict=True)))
    assert out.cumulative_logprob < 0
    for entry in out.logprobs:
        for tid, lp in entry.items():
            assert lp.decoded_token == tok.decode([tid], skip_special_tokens=False)
    plain = _gen(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=4))
    assert plain.cumulative_logprob is None and plain.logprobs is None


@pytest.mark.parametrize("stream", [True, False])
def test_outputs_do_not_share_lists_the_engine_keeps_appending_to(llm, stream: bool) -> None:
    eng = llm.llm_engine
    eng.add_request("Hello", SamplingParams(temperature=0.0, max_tokens=10, logprobs=1,
                                            ignore_eos=True), "live")
    seen = []
    while eng.has_unfinished_requests():
        for out in eng.step(stream=stream):
            c = out.outputs[0]
            seen.append((c, len(c.token_ids), len(c.logprobs), len(c.delta_token_ids),
                         len(c.delta_logprobs)))
    assert len(seen) == 10
    for c, n_tok, n_lp, n_dtok, n_dlp in seen:  # nothing grew after it was handed out
        assert (len(c.token_ids), len(c.logprobs)) == (n_tok, n_lp)
        assert (len(c.delta_token_ids), len(c.delta_logprobs)) == (n_dtok, n_dlp) == (1, 1)
    final = seen[-1][0]
    assert final.finish_reason == "length" and len(final.token_ids) == len(final.logprobs) == 10
    assert [t for c, *_ in seen for t in c.delta_token_ids] == final.token_ids
    if not stream:
        assert [len(c.token_ids) for c, *_ in seen] == list(range(1, 11))
    assert eng.output_processor.groups == {}
    assert all(s.status is not RequestStatus.RUNNING for s in eng.scheduler.running)


def test_logprobs_past_max_logprobs_are_refused_by_the_engine(llm, tiny_llama_dir,
                                                               make_llm) -> None:
    with pytest.raises(ValueError, match=r"logprobs must be <= max_logprobs \(20"):
        _gen(llm, "Hello", SamplingParams(logprobs=21))
    wide = make_llm(tiny_llama_dir, max_model_len=64, max_logprobs=30)
    assert len(_gen(wide, "Hello", SamplingParams(max_tokens=2, logprobs=30)).logprobs[0]) >= 30
