"""`LLM.beam_search` against HF `generate(num_beams=4, do_sample=False)` on a tiny random
Llama whose EOS is a token the beams often propose (so hypotheses finish at different
lengths and length_penalty / early_stopping decide), with the block accounting checked after
every engine step: beams share their prefix blocks (refcount = beams holding them) and every
refcount is back to 0 after the search."""

from __future__ import annotations

import pytest
import torch
import transformers

from pagedllm import BeamSearchParams
from pagedllm.beam_search import InvalidBeamSearchParams
from tests.beam_search_reference import EOS, PROMPTS, make_beam_checkpoint
from tests.beam_search_reference import hf_beams as hf_reference_beams

BEAMS, MAX_TOKENS, BLOCK_SIZE = 4, 12, 4


@pytest.fixture(scope="module")
def eos_model_dir(tmp_path_factory, tiny_tokenizer):
    return make_beam_checkpoint(tmp_path_factory.mktemp("beam_llama"), tiny_tokenizer)


@pytest.fixture(scope="module")
def llm(eos_model_dir, make_llm):
    return make_llm(eos_model_dir, max_model_len=128, block_size=BLOCK_SIZE)


@pytest.fixture(scope="module")
def hf_model(eos_model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(
        eos_model_dir, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="module")
def prompt_ids(tiny_tokenizer):
    return [tiny_tokenizer.encode(t) for t in PROMPTS]


class StepWatch:
    """Block invariants after every engine step; while a step runs (its requests finish
    within it: one token each), the most references one block had and the most tokens a
    request computed after the first step (the prompts' prefill)."""

    def __init__(self, engine) -> None:
        self.engine, self.steps, self.max_refcount = engine, 0, 0
        self.executes, self.max_new_tokens_later = 0, 0
        self._step, self._execute = engine.step, engine.runner.execute
        engine.step, engine.runner.execute = self.step, self.execute

    def step(self, *args, **kwargs):
        out = self._step(*args, **kwargs)
        self.engine.check_invariants()
        self.steps += 1
        return out

    def execute(self, sched):
        self.engine.check_invariants()
        self.max_refcount = max(
            self.max_refcount, max(b.ref_cnt for b in self.engine.block_manager.blocks)
        )
        if self.executes:
            self.max_new_tokens_later = max(
                self.max_new_tokens_later, *(s.num_new_tokens for s in sched.scheduled)
            )
        self.executes += 1
        return self._execute(sched)

    def restore(self) -> None:
        self.engine.step, self.engine.runner.execute = self._step, self._execute


def hf_beams(model, prompt: list[int], **kwargs):
    return hf_reference_beams(model, prompt, BEAMS, MAX_TOKENS, **kwargs)


@pytest.mark.parametrize("early_stopping", [False, True, "never"])
@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0, -0.5])
def test_equals_hf_beam_search(llm, hf_model, prompt_ids, length_penalty, early_stopping):
    engine = llm.llm_engine
    watch = StepWatch(engine)
    try:
        params = BeamSearchParams(
            beam_width=BEAMS,
            max_tokens=MAX_TOKENS,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
        )
        outs = llm.beam_search([{"prompt_token_ids": p} for p in prompt_ids], params)
    finally:
        watch.restore()
    reasons = set()
    for prompt, out in zip(prompt_ids, outs, strict=True):
        want, scores = hf_beams(
            hf_model, prompt, length_penalty=length_penalty, early_stopping=early_stopping
        )
        got = [s.tokens[len(prompt) :] for s in out.sequences]
        assert got == want
        assert [s.tokens[: len(prompt)] for s in out.sequences] == [prompt] * BEAMS
        assert [s.score for s in out.sequences] == pytest.approx(scores, abs=1e-4)
        for s in out.sequences:
            n = len(s.tokens) - len(prompt)
            assert len(s.logprobs) == n
            assert s.cum_logprob == pytest.approx(
                sum(
                    lp[t].logprob for lp, t in zip(s.logprobs, s.tokens[len(prompt) :], strict=True)
                )
            )
            assert s.score == pytest.approx(s.cum_logprob / n**length_penalty)
            assert s.finish_reason == ("stop" if s.tokens[-1] == EOS else "length")
            assert s.text == llm.get_tokenizer().decode(s.tokens)
            reasons.add(s.finish_reason)
    assert reasons == {"stop", "length"}  # hypotheses of both kinds were ranked
    assert watch.max_refcount >= BEAMS  # the beams of a step shared their prefix blocks
    # ... found in the prefix cache: each beam computed only its last, partly filled block
    assert 1 <= watch.max_new_tokens_later <= BLOCK_SIZE
    assert engine.block_manager.num_free_blocks == engine.num_blocks  # refcounts all 0
    engine.check_idle()


def test_ignore_eos_runs_every_beam_to_max_tokens(llm, hf_model, prompt_ids):
    """ignore_eos: EOS is an ordinary token (HF: no EOS at all)."""
    params = BeamSearchParams(beam_width=BEAMS, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompt_ids], params)
    for prompt, out in zip(prompt_ids, outs, strict=True):
        want, scores = hf_beams(hf_model, prompt, eos=None)
        assert [s.tokens[len(prompt) :] for s in out.sequences] == want
        assert [s.score for s in out.sequences] == pytest.approx(scores, abs=1e-4)
        assert {s.finish_reason for s in out.sequences} == {"length"}
    assert any(EOS in s.tokens for out in outs for s in out.sequences)


def test_text_prompts_beam_width_one_is_greedy(llm):
    from pagedllm import SamplingParams

    out = llm.beam_search(PROMPTS[1], BeamSearchParams(beam_width=1, max_tokens=8))
    greedy = llm.generate(
        PROMPTS[1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False
    )[0]
    (seq,) = out[0].sequences
    assert seq.tokens[len(greedy.prompt_token_ids) :] == greedy.outputs[0].token_ids
    assert seq.text == llm.get_tokenizer().decode(seq.tokens)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(beam_width=0, max_tokens=4), "beam_width must be an integer >= 1, got 0"),
        (dict(beam_width=2, max_tokens=0), "max_tokens must be an integer >= 1, got 0"),
        (dict(beam_width=2, max_tokens=4, temperature=0.7), "temperature must be 0, got 0.7"),
        (
            dict(beam_width=2, max_tokens=4, length_penalty=float("nan")),
            "length_penalty must be a finite number",
        ),
        (
            dict(beam_width=2, max_tokens=4, early_stopping="sometimes"),
            "early_stopping must be true, false or 'never'",
        ),
    ],
)
def test_invalid_params(kwargs, message):
    with pytest.raises(InvalidBeamSearchParams, match=message):
        BeamSearchParams(**kwargs)


def test_limits_are_checked_before_anything_runs(llm, prompt_ids):
    engine = llm.llm_engine
    with pytest.raises(
        ValueError,
        match=r"beam_width 11 needs 22 logprobs per step; "
        r"max_logprobs is 20 .* must be <= 10",
    ):
        llm.beam_search("Hi", BeamSearchParams(beam_width=11, max_tokens=4))
    with pytest.raises(ValueError, match=r"max_tokens is 120: .* > max_model_len 128"):
        llm.beam_search(
            ["Hi", {"prompt_token_ids": prompt_ids[1]}],
            BeamSearchParams(beam_width=2, max_tokens=120),
        )
    with pytest.raises(ValueError, match="prompt must not be empty"):
        llm.beam_search([[]], BeamSearchParams(beam_width=2, max_tokens=4))
    assert not engine.has_unfinished_requests()
    engine.check_idle()


@pytest.mark.parametrize(
    "engine_args",
    [
        # no prefix caching: every step recomputes whole beams (and says so once)
        dict(enable_prefix_caching=False),
        # a pool of 40 blocks: a step's beams do not all fit, cached prefixes are evicted
        dict(kv_cache_memory=40 * BLOCK_SIZE * 512, max_model_len=64),
    ],
    ids=["no-prefix-caching", "small-pool"],
)
def test_same_beams_without_cache_and_under_memory_pressure(
    eos_model_dir, make_llm, hf_model, prompt_ids, engine_args, caplog
):
    llm = make_llm(eos_model_dir, block_size=BLOCK_SIZE, **{"max_model_len": 128, **engine_args})
    engine = llm.llm_engine
    watch = StepWatch(engine)
    params = BeamSearchParams(beam_width=BEAMS, max_tokens=MAX_TOKENS)
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompt_ids], params)
    watch.restore()
    for prompt, out in zip(prompt_ids, outs, strict=True):
        want, scores = hf_beams(hf_model, prompt)
        assert [s.tokens[len(prompt) :] for s in out.sequences] == want
        assert [s.score for s in out.sequences] == pytest.approx(scores, abs=1e-4)
    if engine.block_manager.enable_caching:
        assert engine.num_blocks == 40
        assert watch.executes > MAX_TOKENS + 1  # some steps' beams ran in several batches
    else:
        assert "without prefix caching" in caplog.text
        assert watch.max_new_tokens_later > BLOCK_SIZE
    engine.check_idle()
