"""Several decode steps per engine step (`num_scheduler_steps`, core/multi_step.py,
model/decode_steps.py): the same tokens as one step at a time (and as HF) for batches, stop
tokens and strings inside a run, max_tokens and max_model_len cutting a run, GGUF, bf16,
int8, AWQ and GPTQ weights and tables, an int8 KV cache, Qwen2 / Qwen3 layers; random rows
(seeded or not, top-k / top-p) as single steps draw them; it does run (fewer engine steps
than tokens); rows it cannot serve run one step at a time; the scheduler's plan (caps,
fallbacks, no blocks left behind)."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from pagedllm import SamplingParams
from pagedllm.core.block_manager import BlockManager
from pagedllm.core.multi_step import ROWS_PER_RUN, plan_steps, runs_ahead
from pagedllm.core.request import Request
from pagedllm.core.scheduler_output import ScheduledRequest, SchedulerOutput
from tests.conftest import make_tiny_checkpoint
from tests.loader.gguf_writer import write_gguf

PROMPTS = [[5, 9, 200, 17], list(range(30, 63)), [400, 3, 3, 77, 12, 9, 101]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=21, ignore_eos=True)


def run(llm, prompts, params) -> tuple[list, int]:
    """(outputs, engine steps taken) of one generate call."""
    before = llm.llm_engine.stats.num_steps
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0] for o in outs], llm.llm_engine.stats.num_steps - before


def same(a: list, b: list) -> None:
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert x.text == y.text and x.finish_reason == y.finish_reason
        assert x.stop_reason == y.stop_reason


@pytest.fixture(scope="module")
def pair(tiny_llama_dir: Path, make_llm):
    """The tiny Llama with 8 steps per engine step (the default) and with 1."""
    return (make_llm(tiny_llama_dir, enable_prefix_caching=False),
            make_llm(tiny_llama_dir, enable_prefix_caching=False, num_scheduler_steps=1))


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["one", "three"])
def test_same_tokens_as_single_steps_and_hf(pair, prompts, tiny_llama_dir, hf_reference
                                            ) -> None:
    multi, single = pair
    got, steps = run(multi, prompts, GREEDY)
    want, single_steps = run(single, prompts, GREEDY)
    same(got, want)
    assert steps < single_steps // 3  # it ran ahead: 21 tokens in ~1 + 3 steps, not 21
    ref, _ = hf_reference.greedy(tiny_llama_dir, prompts[0], GREEDY.max_tokens)
    assert got[0].token_ids == ref


def test_stops_inside_a_run(pair) -> None:
    """A stop token, a stop string and EOS in the middle of a run end the row there (later
    tokens dropped, the text as one step at a time gives it)."""
    multi, single = pair
    free, _ = run(single, PROMPTS, GREEDY)
    stop_tok = free[1].token_ids[5]  # the 6th token of row 1: inside the first run
    text = free[2].text
    params = [SamplingParams(temperature=0.0, max_tokens=21, stop_token_ids=[stop_tok]),
              SamplingParams(temperature=0.0, max_tokens=21, stop=[text[len(text) // 2:][:3]]),
              SamplingParams(temperature=0.0, max_tokens=13)]  # EOS counts here
    for p in params:
        got, _ = run(multi, PROMPTS, p)
        want, _ = run(single, PROMPTS, p)
        same(got, want)
    assert any(o.finish_reason == "stop" for o in run(multi, PROMPTS, params[0])[0])


@pytest.mark.parametrize("fixture,extra", [("tiny_llama_dir", {"kv_cache_dtype": "int8"}),
                                           ("tiny_llama_dir", {"dtype": "bfloat16"}),
                                           ("tiny_llama_dir", {"quantization": "int8"}),
                                           ("tiny_qwen3_dir", {}), ("tiny_qwen2_dir", {})],
                         ids=["int8-kv", "bf16-table", "int8-weights", "qwen3-head-norms",
                              "qwen2-biases"])
def test_other_caches_and_layers(fixture: str, extra: dict, request, make_llm) -> None:
    model_dir = request.getfixturevalue(fixture)
    got, steps = run(make_llm(model_dir, enable_prefix_caching=False, **extra), PROMPTS, GREEDY)
    want, single_steps = run(make_llm(model_dir, enable_prefix_caching=False,
                                      num_scheduler_steps=1, **extra), PROMPTS, GREEDY)
    same(got, want)
    assert steps < single_steps // 3


def test_gemma3_groups_and_ropes(tiny_gemma3_dir: Path, make_llm, hf_reference) -> None:
    """Gemma 3 (scaled embedding, two RoPE tables, sliding layers in their own KV groups whose
    blocks leave the window during a run): the tokens of one step at a time and HF's."""
    prompts = [list(range(30, 63)), [5, 9, 200, 17], [7] * 14]  # 33 tokens: past window 16
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    multi = make_llm(tiny_gemma3_dir, enable_prefix_caching=False)
    assert multi.llm_engine.kv_spec.groups.num_groups == 4
    got, steps = run(multi, prompts, params)
    want, single_steps = run(make_llm(tiny_gemma3_dir, enable_prefix_caching=False,
                                      num_scheduler_steps=1), prompts, params)
    same(got, want)
    assert steps < single_steps // 3
    for prompt, out in zip(prompts, got, strict=True):
        assert out.token_ids == hf_reference.greedy(tiny_gemma3_dir, prompt, 30)[0]
    # seeded random rows: the draws single steps make
    sampled = [SamplingParams(temperature=0.9, top_k=20, max_tokens=30, ignore_eos=True,
                              seed=s) for s in (1, 2, 3)]
    multi_s = make_llm(tiny_gemma3_dir, enable_prefix_caching=False)
    single_s = make_llm(tiny_gemma3_dir, enable_prefix_caching=False, num_scheduler_steps=1)
    got, steps = run(multi_s, prompts, sampled)
    want, single_steps = run(single_s, prompts, sampled)
    same(got, want)
    assert steps < single_steps // 3


def test_max_model_len_cuts_a_run(tiny_llama_dir: Path, make_llm) -> None:
    prompt = list(range(40, 90))  # 50 tokens, 14 left before 64
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    got, _ = run(make_llm(tiny_llama_dir, max_model_len=64), [prompt], params)
    want, _ = run(make_llm(tiny_llama_dir, max_model_len=64, num_scheduler_steps=1),
                  [prompt], params)
    same(got, want)
    assert len(got[0].token_ids) == 14 and got[0].finish_reason == "length"


def test_rows_it_cannot_serve_run_one_step_at_a_time(pair) -> None:
    """logprobs, min_p, a penalty: the engine steps once per token, the outputs equal the
    single-step engine's (same seed)."""
    multi, single = pair
    for p in (SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.8, max_tokens=9, ignore_eos=True, seed=3, min_p=0.1),
              SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True,
                             repetition_penalty=1.3)):
        got, steps = run(multi, PROMPTS[:1], p)
        want, _ = run(single, PROMPTS[:1], p)
        same(got, want)
        assert steps >= 9


def sampled(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.9, "max_tokens": 21, "ignore_eos": True, **kw})


def test_random_rows_same_as_single_steps(tiny_llama_dir: Path, make_llm) -> None:
    """A seeded random row, an unseeded one and a greedy one in one batch, twice: the same
    tokens as one step at a time (fresh engines of one seed: unseeded rows draw from the
    engine's generator, seeded ones from their own, ahead of the run and then set back to
    where the steps it ran leave them), and it ran ahead."""
    multi = make_llm(tiny_llama_dir, enable_prefix_caching=False)
    single = make_llm(tiny_llama_dir, enable_prefix_caching=False, num_scheduler_steps=1)
    params = [sampled(seed=11), sampled(), GREEDY]
    for _ in range(2):
        got, steps = run(multi, PROMPTS, params)
        want, single_steps = run(single, PROMPTS, params)
        same(got, want)
        assert steps < single_steps // 3
    greedy, _ = run(single, PROMPTS[:1], GREEDY)
    assert got[0].token_ids != greedy[0].token_ids  # (it did sample)


def test_random_rows_stop_inside_a_run(pair) -> None:
    """Seeded random rows ending on a stop token, a stop string and max_tokens inside a run:
    the same tokens, text and reasons as one step at a time."""
    multi, single = pair
    free, _ = run(single, PROMPTS, [sampled(seed=s) for s in (1, 2, 3)])
    text = free[2].text
    params = [sampled(seed=1, stop_token_ids=[free[0].token_ids[4]]),
              sampled(seed=2, max_tokens=6),
              sampled(seed=3, stop=[text[len(text) // 2:][:3]])]
    got, _ = run(multi, PROMPTS, params)
    want, _ = run(single, PROMPTS, params)
    same(got, want)
    assert got[0].finish_reason == "stop" and len(got[0].token_ids) <= 5


@pytest.fixture(scope="module")
def wide_llama_dir(tmp_path_factory) -> Path:
    """The tiny Llama with a 2,048-token vocabulary: above top_k_top_p.CANDIDATES, so a
    row's thresholds come from its candidates, or past them for a flat row (the tiny
    vocabulary sorts every row whole)."""
    from tests.conftest import _train_tokenizer

    return make_tiny_checkpoint(tmp_path_factory.mktemp("wide"), "llama",
                                _train_tokenizer(2048), vocab_size=2048)


@pytest.mark.parametrize("fixture", ["wide_llama_dir", "tiny_llama_dir"], ids=["2048", "512"])
def test_top_k_top_p_rows_same_as_single_steps(fixture: str, request, make_llm) -> None:
    """top-p, top-k, both, a temperature high enough (8) for flat rows whose nucleus lies
    past the candidates: the same tokens as one step at a time, and it ran ahead."""
    model_dir = request.getfixturevalue(fixture)
    multi = make_llm(model_dir, enable_prefix_caching=False)
    single = make_llm(model_dir, enable_prefix_caching=False, num_scheduler_steps=1)
    params = [sampled(seed=4, top_p=0.8), sampled(seed=5, top_k=20),
              sampled(seed=6, top_k=1500, top_p=0.95, temperature=8.0)]
    got, steps = run(multi, PROMPTS, params)
    want, single_steps = run(single, PROMPTS, params)
    same(got, want)
    assert steps < single_steps // 3


def test_fan_out_and_a_prompts_last_token_are_not_run_ahead(tiny_llama_dir: Path, make_llm
                                                            ) -> None:
    """A 17-token prompt in chunks of 16: its last token is computed alone, a step that looks
    like a decode. n = 2 samples two rows there (both completions kept), prompt logprobs score
    it."""
    args = dict(enable_prefix_caching=False, max_num_batched_tokens=16)
    multi = make_llm(tiny_llama_dir, **args)
    single = make_llm(tiny_llama_dir, num_scheduler_steps=1, **args)
    prompt = list(range(30, 47))
    for p in (sampled(seed=8, n=2, max_tokens=6), sampled(temperature=0.0, n=2, max_tokens=6),
              sampled(temperature=0.0, max_tokens=6, prompt_logprobs=1)):
        got = multi.generate([prompt], p, use_tqdm=False)[0]
        want = single.generate([prompt], p, use_tqdm=False)[0]
        assert [o.token_ids for o in got.outputs] == [o.token_ids for o in want.outputs]
        assert len(got.outputs) == p.n
        assert got.prompt_logprobs == want.prompt_logprobs


@pytest.mark.parametrize("method", ["awq", "gptq"])
def test_awq_gptq_weights(method: str, tmp_path_factory, tiny_llama_dir: Path, make_llm) -> None:
    """AWQ / GPTQ int4 checkpoints (their C++ linears, a dense table): the same tokens, greedy
    and sampled, and it ran ahead."""
    from tests.model.quant import hf_packers

    root = tmp_path_factory.mktemp(method)
    hf_packers.write_quantized(tiny_llama_dir, root / "q", root / "ref", method, 32, sym=False,
                               desc_act=False)
    multi = make_llm(root / "q", enable_prefix_caching=False)
    single = make_llm(root / "q", enable_prefix_caching=False, num_scheduler_steps=1)
    for params in (GREEDY, [sampled(seed=21), sampled(seed=22, top_p=0.9), GREEDY]):
        got, steps = run(multi, PROMPTS, params)
        want, single_steps = run(single, PROMPTS, params)
        same(got, want)
        assert steps < single_steps // 3


@pytest.mark.parametrize("int8_activations", [True, False], ids=["a8-panels", "gguf-rows"])
def test_gguf_tied_table(tmp_path_factory, tiny_tokenizer, make_llm, int8_activations) -> None:
    """A tied GGUF Q4_1 table, in int8-activation panels or the exact path's layout: the
    C++ steps look its rows up with the kernel its `embedding` calls; the same tokens."""
    root = tmp_path_factory.mktemp("ms")
    src = make_tiny_checkpoint(root / "hf", "llama", tiny_tokenizer, tie_word_embeddings=True)
    path = write_gguf(src, root / "q4_1.gguf", "llama", gguf.GGMLQuantizationType.Q4_1)
    args = dict(enable_prefix_caching=False, int8_activations=int8_activations)
    got, steps = run(make_llm(path, **args), PROMPTS, GREEDY)
    want, single_steps = run(make_llm(path, num_scheduler_steps=1, **args), PROMPTS, GREEDY)
    same(got, want)
    assert steps < single_steps // 3


def _request(i: int, params: SamplingParams, prompt_len: int = 8) -> Request:
    req = Request(f"r{i}", list(range(1, prompt_len + 1)), params, eos_token_id=1)
    return req


def _decoding(bm: BlockManager, n: int, params: SamplingParams = GREEDY) -> SchedulerOutput:
    """n requests one token into their output, each scheduled for one decode token."""
    out = SchedulerOutput()
    for i in range(n):
        req = _request(i, params)
        assert bm.allocate_slots(req, req.num_tokens)
        req.num_computed_tokens = req.num_tokens
        req.append_token(7, None, 0.0)
        assert bm.allocate_slots(req, 1)
        out.scheduled.append(ScheduledRequest(req, 1))
    return out


def test_plan_caps_and_fallbacks() -> None:
    bm = BlockManager(256, 16)
    out = _decoding(bm, 2)
    assert plan_steps(out, bm, 8, 1024, others_waiting=False) == 8
    assert all(len(s.request.block_ids) == 1 for s in out.scheduled)  # 9..16: one block
    assert plan_steps(_decoding(bm, 2), bm, 8, 1024, others_waiting=True) == 1
    assert plan_steps(_decoding(bm, 2), bm, 1, 1024, others_waiting=False) == 1
    assert plan_steps(_decoding(bm, 8), bm, 8, 1024, others_waiting=False) == ROWS_PER_RUN // 8
    assert plan_steps(_decoding(bm, 2), bm, 8, 12, others_waiting=False) == 12 - 9
    short = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    assert plan_steps(_decoding(bm, 2, short), bm, 8, 1024, others_waiting=False) == 3
    assert plan_steps(_decoding(bm, 1, SamplingParams(temperature=0.5)), bm, 8, 1024,
                      others_waiting=False) == 8
    assert plan_steps(_decoding(bm, 1, SamplingParams(temperature=0.5, min_p=0.2)), bm, 8,
                      1024, others_waiting=False) == 1


def test_plan_without_free_blocks_takes_none() -> None:
    """Blocks for every step or one step: nothing is left allocated when it falls back."""
    bm = BlockManager(7, 4)
    out = _decoding(bm, 2)  # 9 tokens + 1: 3 blocks each; 8 steps need 2 more
    assert bm.num_free_blocks < 2
    held = [list(s.request.block_ids) for s in out.scheduled]
    assert plan_steps(out, bm, 8, 1024, others_waiting=False) == 1
    assert [s.request.block_ids for s in out.scheduled] == held


def _past_prompt(params: SamplingParams) -> Request:
    req = _request(0, params)
    req.num_computed_tokens = req.num_tokens
    return req


def test_runs_ahead_rules() -> None:
    for p in (GREEDY, SamplingParams(temperature=1.0, top_k=5, top_p=0.9, seed=1)):
        req = _past_prompt(p)
        assert runs_ahead(req)
        req.num_computed_tokens -= 1  # the prompt's last token: its first sample is a prefill's
        assert not runs_ahead(req)
    assert not runs_ahead(_past_prompt(SamplingParams(temperature=1.0, n=2)))  # n rows, 1 logits
    for p in (SamplingParams(temperature=1.0, min_p=0.1),
              SamplingParams(temperature=0.0, logprobs=1),
              SamplingParams(temperature=0.0, presence_penalty=0.5),
              SamplingParams(temperature=0.0, logit_bias={3: 1.0}),
              SamplingParams(temperature=0.0, allowed_token_ids=[3, 4]),
              SamplingParams(temperature=0.0, min_tokens=4)):
        assert not runs_ahead(_past_prompt(p))


@pytest.mark.parametrize("params", [GREEDY, sampled(seed=9)], ids=["greedy", "sampled"])
def test_non_finite_logits_inside_a_run_fail_the_row_as_single_steps_do(tiny_llama_dir: Path,
                                                                        params) -> None:
    """An embedding row of NaN for the 6th generated token: its step's logits are not finite.
    Inside a run the C++ steps stop before it, the next run's first step finds it and the
    step runs the ordinary way, whose sampler fails that request alone, as one step at a time
    does; the other request's tokens are unchanged."""
    import torch

    from pagedllm.engine.llm_engine import LLMEngine

    def finals(steps: int, poison: int | None) -> dict:
        engine = LLMEngine.from_engine_args(model=str(tiny_llama_dir), kv_cache_memory="4MiB",
                                            num_threads=1, enable_prefix_caching=False,
                                            num_scheduler_steps=steps)
        if poison is not None:
            with torch.no_grad():
                engine.model.model.embed_tokens.weight[poison] = float("nan")
        for i, prompt in enumerate(PROMPTS[:2]):
            engine.add_request(prompt, params, f"r{i}")
        got = {}
        while engine.has_unfinished_requests():
            got.update((o.request_id, o) for o in engine.step() if o.finished)
        return got

    clean = finals(1, None)
    poison = clean["r0"].outputs[0].token_ids[5]
    assert poison not in PROMPTS[0] + PROMPTS[1] + clean["r1"].outputs[0].token_ids
    multi, single = finals(8, poison), finals(1, poison)
    assert "not finite" in str(multi["r0"].error) and str(multi["r0"].error) == str(single["r0"].error)
    assert multi["r1"].error is None
    assert multi["r1"].outputs[0].token_ids == clean["r1"].outputs[0].token_ids
