"""The offline API (`LLM.generate`, `LLM.chat`) and `LLMEngine` on a tiny random Llama:
input forms and ordering, sampling semantics (seeds, n, stop conditions), validation errors,
aborts, and the block accounting staying consistent through all of it."""

from __future__ import annotations

import random
import re

import pytest

from pagedllm import SamplingParams
from pagedllm.core.scheduler_output import SchedulerOutput

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
MAX_MODEL_LEN = 256


@pytest.fixture(scope="module")
def llm(tiny_llama_dir, make_llm):
    return make_llm(tiny_llama_dir, max_model_len=MAX_MODEL_LEN)


@pytest.fixture(autouse=True)
def _engine_left_clean(request):
    """Every test that used the shared LLM must leave it with no requests and no blocks."""
    yield
    if "llm" in request.fixturenames:
        assert_idle(request.getfixturevalue("llm").llm_engine)


def assert_idle(engine) -> None:
    assert not engine.has_unfinished_requests()
    assert engine.get_num_unfinished_requests() == 0
    assert engine.output_processor.groups == {}
    assert engine.block_manager.num_free_blocks == engine.num_blocks
    engine.check_invariants()


def record_schedules(engine) -> list[SchedulerOutput]:
    """Keep every SchedulerOutput the engine's scheduler produces from now on."""
    outs: list[SchedulerOutput] = []
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        outs.append(schedule())
        return outs[-1]

    engine.scheduler.schedule = recording
    return outs


def gen(llm, prompts, params=GREEDY):
    return llm.generate(prompts, params, use_tqdm=False)


def tokens(llm, prompt, params=GREEDY) -> list[int]:
    return gen(llm, prompt, params)[0].outputs[0].token_ids


# ------------------------------------------------------------------------ inputs, order
def test_input_forms_agree(llm) -> None:
    text = "The quick brown fox"
    ids = llm.get_tokenizer().encode(text)
    expected = tokens(llm, text)
    assert len(expected) == GREEDY.max_tokens

    (single,) = gen(llm, text)
    assert single.prompt == text and single.prompt_token_ids == ids
    for form in ([text], ids, [ids], {"prompt_token_ids": ids}, {"prompt": text},
                 [{"prompt_token_ids": ids, "prompt": text}]):
        outs = gen(llm, form)
        assert len(outs) == 1, form
        assert outs[0].prompt_token_ids == ids
        assert outs[0].outputs[0].token_ids == expected, form
    assert gen(llm, ids)[0].prompt is None
    assert gen(llm, {"prompt_token_ids": ids, "prompt": text})[0].prompt == text


def test_results_come_back_in_input_order(llm) -> None:
    prompts = ["a", "bb bb", "ccc ccc ccc ccc", "dddd " * 12, "e", "The end of the list"]
    # Earlier prompts ask for more tokens, so they finish last.
    params = [SamplingParams(temperature=0.0, max_tokens=12 - 2 * i) for i in range(6)]
    outs = gen(llm, prompts, params)
    assert [o.prompt for o in outs] == prompts
    assert len({o.request_id for o in outs}) == len(prompts)
    for prompt, p, out in zip(prompts, params, outs, strict=True):
        assert out.finished
        assert len(out.outputs[0].token_ids) == p.max_tokens
        assert out.outputs[0].token_ids == tokens(llm, prompt, p)


def test_empty_prompt_list(llm) -> None:
    assert gen(llm, []) == []


def test_chat_applies_the_template(llm) -> None:
    tok = llm.get_tokenizer()
    conv = [{"role": "user", "content": "hi there"}]
    (out,) = llm.chat(conv, GREEDY, use_tqdm=False)
    expected_ids = tok.apply_chat_template(conv, add_generation_prompt=True,
                                           tokenize=True)["input_ids"]
    assert out.prompt_token_ids == expected_ids
    assert out.prompt == "<s>user: hi there\n<s>assistant:"
    assert out.outputs[0].token_ids == tokens(llm, {"prompt_token_ids": expected_ids})

    convs = [conv, [{"role": "user", "content": "second"}]]
    outs = llm.chat(convs, GREEDY, use_tqdm=False, add_generation_prompt=False)
    assert [o.prompt for o in outs] == ["<s>user: hi there\n", "<s>user: second\n"]


# ---------------------------------------------------------------------------- sampling
def test_seeded_sampling_is_reproducible_and_independent_of_batch_mates(
        llm, tiny_llama_dir, make_llm) -> None:
    seeded = SamplingParams(temperature=1.0, seed=42, max_tokens=16)
    alone = tokens(llm, "Hello", seeded)
    assert tokens(llm, "Hello", seeded) == alone
    assert tokens(llm, "Hello", SamplingParams(temperature=1.0, seed=43, max_tokens=16)) != alone

    rng = random.Random(0)
    mates = [" ".join(rng.choice(["x", "yy", "zzz"]) for _ in range(rng.randint(1, 30)))
             for _ in range(5)]
    prompts = [*mates[:2], "Hello", *mates[2:]]
    params = [SamplingParams(temperature=1.0, max_tokens=rng.randint(1, 20)) for _ in mates]
    params.insert(2, seeded)
    params[0] = SamplingParams(temperature=0.7, seed=42, max_tokens=9)  # same seed, other row
    assert gen(llm, prompts, params)[2].outputs[0].token_ids == alone

    # Chunked prefill, small blocks and preemption do not change a seeded sample either.
    tight = make_llm(tiny_llama_dir, block_size=8, max_num_batched_tokens=16,
                     max_model_len=128, kv_cache_memory=16 * 8 * 512)  # 16 blocks of 8
    outs = gen(tight, prompts, params)
    assert outs[2].outputs[0].token_ids == alone
    assert tight.llm_engine.stats.num_preemptions_total > 0


def test_n_samples_fork_the_prompt_blocks(tiny_llama_dir, make_llm) -> None:
    llm = make_llm(tiny_llama_dir)             # block_size 16
    engine = llm.llm_engine
    prompt = list(range(100, 120))             # 20 tokens: block 0 full, block 1 partial
    rid = engine.add_request(prompt, SamplingParams(n=2, temperature=1.0, seed=5,
                                                    max_tokens=12))
    group = engine.output_processor.groups[rid]
    engine.step()                              # prefill, sample 2 tokens, fan out
    engine.check_invariants()
    parent, child = group.seqs
    assert parent.block_ids == child.block_ids and len(parent.block_ids) == 2
    assert [engine.block_manager.blocks[b].ref_cnt for b in parent.block_ids] == [2, 2]
    assert engine.block_manager.num_free_blocks == engine.num_blocks - 2
    shared_full, shared_partial = parent.block_ids

    steps = record_schedules(engine)
    engine.step()                              # position 20 lands in the shared partial block
    engine.check_invariants()
    assert parent.block_ids[0] == child.block_ids[0] == shared_full
    assert engine.block_manager.blocks[shared_full].ref_cnt == 2
    assert shared_partial in (parent.block_ids[1], child.block_ids[1])
    assert parent.block_ids[1] != child.block_ids[1]
    assert steps[0].blocks_to_copy == [(shared_partial, parent.block_ids[1])]  # copy-on-write

    while engine.has_unfinished_requests():
        outs = engine.step()
        engine.check_invariants()
    (out,) = outs
    assert out.finished and out.prompt_token_ids == prompt
    a, b = out.outputs
    assert (a.index, b.index) == (0, 1)
    assert len(a.token_ids) == len(b.token_ids) == 12
    assert a.token_ids != b.token_ids          # different samples from one prompt
    assert_idle(engine)


def test_n_greedy_samples_are_identical_and_equal_to_n1(llm) -> None:
    prompt = list(range(200, 237))             # ends mid-block: the fork copies KV
    single = tokens(llm, prompt, SamplingParams(temperature=0.0, max_tokens=20))
    (out,) = gen(llm, prompt, SamplingParams(n=3, temperature=0.0, max_tokens=20))
    assert [c.token_ids for c in out.outputs] == [single] * 3
    assert len({c.text for c in out.outputs}) == 1


def test_n_above_max_num_seqs_runs_at_most_max_num_seqs_per_step(tiny_llama_dir,
                                                                  make_llm) -> None:
    llm = make_llm(tiny_llama_dir, max_num_seqs=2)
    steps = record_schedules(llm.llm_engine)
    single = tokens(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=8))
    (out,) = gen(llm, "Hello", SamplingParams(n=4, temperature=0.0, max_tokens=8))
    assert [c.token_ids for c in out.outputs] == [single] * 4
    assert max(len(out.scheduled) for out in steps) == 2
    assert_idle(llm.llm_engine)


def test_n_with_seed_is_reproducible(llm) -> None:
    params = SamplingParams(n=2, temperature=1.0, seed=9, max_tokens=10)
    first = [c.token_ids for c in gen(llm, "Hi", params)[0].outputs]
    assert first[0] != first[1]
    assert [c.token_ids for c in gen(llm, "Hi", params)[0].outputs] == first


# ------------------------------------------------------------------------ stopping
def _stop_string_for(text: str) -> str:
    """A 3-letter ASCII substring of `text` starting after its first few characters."""
    m = re.search(r"[A-Za-z ]{3}", text[4:])
    assert m, f"no ASCII run in {text!r}"
    return m.group()


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings(llm, include: bool) -> None:
    prompt = "The capital of France is"
    full = gen(llm, prompt, SamplingParams(temperature=0.0, max_tokens=32))[0].outputs[0]
    stop = _stop_string_for(full.text)
    at = full.text.index(stop)
    params = SamplingParams(temperature=0.0, max_tokens=32, stop=["#never#", stop],
                            include_stop_str_in_output=include)
    out = gen(llm, prompt, params)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == full.text[:at + len(stop) if include else at]
    assert out.token_ids == full.token_ids[:len(out.token_ids)]
    assert len(out.token_ids) < len(full.token_ids)


def test_stop_token_ids(llm) -> None:
    full = tokens(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=32))
    stop_id = full[5]
    out = gen(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=32,
                                           stop_token_ids=[stop_id]))[0].outputs[0]
    cut = full.index(stop_id) + 1
    assert out.token_ids == full[:cut]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id


def test_min_tokens_suppresses_stop_tokens(llm) -> None:
    full = tokens(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=32))
    stop_id = full[0]
    out = gen(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=32, min_tokens=6,
                                           stop_token_ids=[stop_id]))[0].outputs[0]
    assert len(out.token_ids) >= 6
    assert stop_id not in out.token_ids[:6]
    assert out.finish_reason == ("stop" if out.token_ids[-1] == stop_id else "length")


def test_max_tokens_finishes_with_length(llm) -> None:
    out = gen(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=7))[0].outputs[0]
    assert len(out.token_ids) == 7
    assert out.finish_reason == "length" and out.stop_reason is None


@pytest.mark.parametrize("room", [5, 0])
def test_max_tokens_none_runs_to_max_model_len(llm, room: int) -> None:
    prompt = list(range(10, 10 + MAX_MODEL_LEN - room))
    out = gen(llm, prompt, SamplingParams(temperature=0.0, max_tokens=None,
                                          ignore_eos=True))[0].outputs[0]
    # A prompt of exactly max_model_len still yields the one token its last position predicts.
    assert len(out.token_ids) == max(room, 1) and out.finish_reason == "length"


def test_eos_finishes_with_stop(llm, monkeypatch) -> None:
    full = tokens(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=32))
    eos = full[4]
    # Make that token the model's EOS (the random model never picks the real one, id 1).
    monkeypatch.setattr(llm.llm_engine.intake, "eos_token_id", eos)
    out = gen(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=32))[0].outputs[0]
    assert out.token_ids == full[:full.index(eos) + 1]
    assert out.finish_reason == "stop" and out.stop_reason is None

    ignored = gen(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=32,
                                               ignore_eos=True))[0].outputs[0]
    assert ignored.token_ids == full and ignored.finish_reason == "length"

    late = gen(llm, "Hello", SamplingParams(temperature=0.0, max_tokens=32,
                                            min_tokens=10))[0].outputs[0]
    assert len(late.token_ids) >= 10 and eos not in late.token_ids[:10]


# ---------------------------------------------------------------------- validation
@pytest.mark.parametrize(("kwargs", "fragments"), [
    ({"temperature": -0.5}, ["temperature", "-0.5"]),
    ({"top_p": 0.0}, ["top_p", "(0, 1]", "0.0"]),
    ({"max_tokens": 0}, ["max_tokens", ">= 1", "0"]),
    ({"n": 0}, ["n must be in [1, 128]", "0"]),
    ({"logprobs": -1}, ["logprobs", ">= 0", "-1"]),
])
def test_sampling_params_errors_name_parameter_and_range(kwargs, fragments) -> None:
    with pytest.raises(ValueError) as exc:
        SamplingParams(**kwargs)
    assert all(f in str(exc.value) for f in fragments), str(exc.value)


@pytest.mark.parametrize(("prompt", "message"), [
    (list(range(MAX_MODEL_LEN + 1)),
     f"prompt has {MAX_MODEL_LEN + 1} tokens, max_model_len is {MAX_MODEL_LEN}"),
    ("", "prompt must not be empty"),
    ({"prompt_token_ids": []}, "prompt must not be empty"),
    ([5, 512, 7], "prompt token id 512 is out of range [0, 512)"),
    ([5, -1], "prompt token id -1 is out of range [0, 512)"),
    ({"other": [1, 2]}, "prompt must be a string or a list of token ids"),
    ([[1, 2], ["a"]], "prompt must be a string or a list of token ids"),
])
def test_invalid_prompts_raise_and_leak_nothing(llm, prompt, message) -> None:
    # The bad prompt comes after valid ones, which were already queued: they must be undone.
    with pytest.raises(ValueError) as exc:
        gen(llm, ["fine", [1, 2, 3], prompt])
    assert message in str(exc.value)
    assert_idle(llm.llm_engine)
    assert tokens(llm, "fine") == tokens(llm, "fine")   # still usable


def test_sampling_params_count_mismatch(llm) -> None:
    with pytest.raises(ValueError, match="got 2 sampling_params for 3 prompts"):
        gen(llm, ["a", "b", "c"], [GREEDY, GREEDY])


def test_duplicate_request_id(llm) -> None:
    engine = llm.llm_engine
    engine.add_request("hello", GREEDY, request_id="dup")
    with pytest.raises(ValueError, match="request_id 'dup' is already in use"):
        engine.add_request("again", GREEDY, request_id="dup")
    engine.abort_request("dup")


def test_add_request_takes_vllms_argument_order(llm) -> None:
    """vLLM's `add_request(request_id, prompt, params)` queues the same request as this
    engine's `add_request(prompt, params, request_id=)`; other objects in the params place
    are a TypeError naming both orders, and nothing is queued."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=4)
    assert engine.add_request("vllm", {"prompt_token_ids": [5, 9, 3]}, params) == "vllm"
    engine.add_request([5, 9, 3], params, request_id="ref")
    outs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out.outputs[0].token_ids
    assert outs["vllm"] == outs["ref"] and len(outs["vllm"]) == 4
    for bad, kind in ((("a", "b", "c"), "str"), (([1, 2], {"max_tokens": 3}), "dict")):
        with pytest.raises(TypeError, match=f"params must be SamplingParams or PoolingParams, "
                                            f"got {kind}"):
            engine.add_request(*bad)
    with pytest.raises(TypeError, match="request_id must be a str, got int"):
        engine.add_request([5, 9, 3], params, 7)
    assert engine.output_processor.groups == {}


# ------------------------------------------------------------------ engine-level runs
def test_abort_mid_generation_frees_everything(tiny_llama_dir, make_llm) -> None:
    llm = make_llm(tiny_llama_dir, block_size=8, max_num_batched_tokens=16)
    engine = llm.llm_engine
    long_prompt = list(range(50, 110))          # 60 tokens: 4 chunks of 16
    a = engine.add_request("a short one", SamplingParams(max_tokens=50))
    c = engine.add_request("forked", SamplingParams(n=3, max_tokens=50))
    b = engine.add_request(long_prompt, SamplingParams(max_tokens=50))
    for _ in range(2):
        engine.step()
        engine.check_invariants()
    seqs = engine.output_processor.groups
    assert len(seqs[c].seqs) == 3               # c fanned out
    assert 0 < seqs[b].seqs[0].num_computed_tokens < len(long_prompt)  # b mid-prefill
    engine.abort_request([b, "no-such-request"])
    engine.check_invariants()
    engine.step()
    engine.abort_request(c)
    engine.check_invariants()
    c_seqs_left = [s for s in engine.scheduler.requests if s.group_id == c]
    assert c_seqs_left == []
    outs = engine.step()
    assert {o.request_id for o in outs} == {a}
    engine.abort_request(a)
    assert_idle(engine)
    assert engine.step() == []


def test_mixed_workload_keeps_invariants_every_step(tiny_llama_dir, make_llm,
                                                    hf_reference) -> None:
    """Preemption, chunked prefill, forks, stop conditions and aborts all at once. Greedy
    requests still match HF and seeded ones match the same request run alone."""
    llm = make_llm(tiny_llama_dir, block_size=8, max_num_batched_tokens=24, max_num_seqs=6,
                   max_model_len=96, kv_cache_memory=16 * 8 * 512)
    engine = llm.llm_engine
    rng = random.Random(1)
    greedy, seeded, others, outputs = {}, {}, [], {}
    steps = record_schedules(engine)

    def add(i: int) -> None:
        prompt = [rng.randrange(2, 512) for _ in range(rng.randint(1, 60))]
        kind = i % 4
        if kind == 0:
            params = SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 30),
                                    ignore_eos=True)
            greedy[engine.add_request(prompt, params)] = (prompt, params)
        elif kind == 1:
            params = SamplingParams(temperature=0.9, seed=i, n=rng.randint(1, 3),
                                    max_tokens=rng.randint(1, 30), logprobs=2)
            seeded[engine.add_request(prompt, params)] = (prompt, params)
        elif kind == 2:                        # siblings stop at different steps
            others.append(engine.add_request(prompt, SamplingParams(
                temperature=1.0, n=2, max_tokens=30, stop=["e", "a"], stop_token_ids=[7, 9])))
        else:
            others.append(engine.add_request(prompt, SamplingParams(
                temperature=1.0, n=2, max_tokens=40)))

    for i in range(10):
        add(i)
    step = 0
    aborted = set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out
        engine.check_invariants()
        step += 1
        if step < 30 and step % 3 == 0:
            add(10 + step)
        if step == 12:
            victims = [rid for rid in others if rid not in outputs][:2]
            engine.abort_request(victims)
            aborted.update(victims)
            engine.check_invariants()
        assert step < 2000
    assert_idle(engine)
    assert max(out.num_batched_tokens for out in steps) <= 24
    assert max(len(out.scheduled) for out in steps) <= 6
    assert engine.stats.num_preemptions_total > 0
    assert aborted and not aborted & outputs.keys()

    for rid, (prompt, params) in greedy.items():
        expected, _ = hf_reference.greedy(tiny_llama_dir, prompt, params.max_tokens)
        assert outputs[rid].outputs[0].token_ids == expected
    roomy = make_llm(tiny_llama_dir)
    for rid, (prompt, params) in seeded.items():
        alone = gen(roomy, {"prompt_token_ids": prompt}, params)[0]
        assert [c.token_ids for c in outputs[rid].outputs] == [
            c.token_ids for c in alone.outputs]


def test_sibling_finishing_early_keeps_invariants(tiny_llama_dir, make_llm) -> None:
    """One of n samples hits a stop string while its siblings run on: the finished sequence
    stays listed in its group (with blocks freed) until the whole group is done. One decode
    step per engine step: with several, all four stop inside the first run."""
    llm = make_llm(tiny_llama_dir, num_scheduler_steps=1)
    engine = llm.llm_engine
    rid = engine.add_request("Hello", SamplingParams(n=4, temperature=1.0, seed=0,
                                                     max_tokens=30, stop=["e", "o"]))
    group = engine.output_processor.groups[rid]
    mixed_steps = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        engine.check_invariants()
        done = [s.is_finished for s in group.seqs]
        mixed_steps += any(done) and not all(done)
    assert mixed_steps > 0
    (out,) = outs
    assert sorted(c.finish_reason for c in out.outputs) != ["length"] * 4
    assert_idle(engine)
