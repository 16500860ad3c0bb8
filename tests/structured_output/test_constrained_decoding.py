"""Constrained decoding on a tiny random model (garbage unless constrained): every output of
every schema, greedy and sampled over seeds, parses and validates; regex / choice / grammar
outputs match; free rows in a mixed batch get the tokens they get alone."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from schemas import SCHEMAS

from pagedllm import SamplingParams, StructuredOutputsParams

PROMPTS = ["Give me a record:", "The answer is"]


def _params(so: StructuredOutputsParams, temperature: float, seed: int | None, **kw):
    kw.setdefault("max_tokens", 300)
    return SamplingParams(temperature=temperature, seed=seed, structured_outputs=so, **kw)


def test_json_schemas_greedy_and_sampled_all_validate(llm):
    assert len(SCHEMAS) >= 15
    jobs, prompts = [], []
    for name, schema in SCHEMAS.items():
        so = StructuredOutputsParams(json=schema)
        for temperature, seed in ((0.0, None), (1.0, 1), (1.0, 2), (1.0, 3)):
            jobs.append((name, temperature, seed))
            prompts.append((PROMPTS[(seed or 0) % 2], _params(so, temperature, seed)))
    outs = llm.generate([p for p, _ in prompts], [s for _, s in prompts], use_tqdm=False)
    for (name, _, seed), out in zip(jobs, outs, strict=True):
        c = out.outputs[0]
        assert c.finish_reason == "stop", (name, seed, c.text)
        value = json.loads(c.text)
        jsonschema.validate(value, SCHEMAS[name],
                            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    # sampling really varies under the grammar (the outputs are not one forced string)
    texts = {o.outputs[0].text for (n, t, _), o in zip(jobs, outs, strict=True)
             if n == "person" and t == 1.0}
    assert len(texts) > 1


def test_json_object_regex_choice_grammar(llm):
    cases = [
        (StructuredOutputsParams(json_object=True), lambda t: isinstance(json.loads(t), dict)),
        (StructuredOutputsParams(regex=r"[a-z]{2,5}-[0-9]{2}"),
         lambda t: re.fullmatch(r"[a-z]{2,5}-[0-9]{2}", t)),
        (StructuredOutputsParams(regex=r"(yes|no), because [a-z ]{1,12}\."),
         lambda t: re.fullmatch(r"(yes|no), because [a-z ]{1,12}\.", t)),
        (StructuredOutputsParams(choice=["red", "green", "blue jeans"]),
         lambda t: t in ("red", "green", "blue jeans")),
        (StructuredOutputsParams(grammar='start: "(" num ("+" num)* ")"\nnum: /[0-9]{1,2}/'),
         lambda t: re.fullmatch(r"\([0-9]{1,2}(\+[0-9]{1,2})*\)", t)),
        (StructuredOutputsParams(grammar='root ::= "x" [ab]{2} "y"'),  # GBNF
         lambda t: re.fullmatch(r"x[ab]{2}y", t)),
    ]
    params, checks = [], []
    for so, check in cases:
        for temperature, seed in ((0.0, None), (1.0, 7), (1.0, 8)):
            params.append(_params(so, temperature, seed, max_tokens=120))
            checks.append(check)
    outs = llm.generate(["Say something:"] * len(params), params, use_tqdm=False)
    for out, check, p in zip(outs, checks, params, strict=True):
        text = out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop", text
        assert check(text), (p.structured_outputs, text)


def test_free_rows_unchanged_by_constrained_neighbours(llm):
    free = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
            SamplingParams(temperature=1.0, seed=11, max_tokens=24, ignore_eos=True)]
    alone = llm.generate(PROMPTS, free, use_tqdm=False)
    so = StructuredOutputsParams(json=SCHEMAS["person"])
    mixed_params = [free[0], _params(so, 0.0, None), free[1], _params(so, 1.0, 5)]
    mixed = llm.generate([PROMPTS[0], "x", PROMPTS[1], "y"], mixed_params, use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert mixed[2].outputs[0].token_ids == alone[1].outputs[0].token_ids
    for out in (mixed[1], mixed[3]):
        jsonschema.validate(json.loads(out.outputs[0].text), SCHEMAS["person"])
    # and the free output is unconstrained garbage, not JSON: the mask did not leak
    assert alone[0].outputs[0].token_ids != mixed[1].outputs[0].token_ids


def test_n_samples_each_follow_the_grammar(llm):
    so = StructuredOutputsParams(json=SCHEMAS["enum_status"])
    out = llm.generate(["Status:"], _params(so, 1.0, 3, n=4), use_tqdm=False)[0]
    assert len(out.outputs) == 4
    for c in out.outputs:
        jsonschema.validate(json.loads(c.text), SCHEMAS["enum_status"])


def test_logprobs_and_preemption_do_not_break_the_matcher(tiny_llama_dir, make_llm):
    # A KV pool so small that the batch preempts (recompute): the matcher keeps its state.
    llm = make_llm(tiny_llama_dir, kv_cache_memory=96 * 2**10, max_num_seqs=8, block_size=8,
                   max_model_len=192)
    so = StructuredOutputsParams(json=SCHEMAS["array_of_objects"])
    params = [_params(so, 1.0, s, logprobs=2) for s in range(6)]
    outs = llm.generate(["Items please:"] * 6, params, use_tqdm=False)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    for o in outs:
        jsonschema.validate(json.loads(o.outputs[0].text), SCHEMAS["array_of_objects"])
        assert len(o.outputs[0].logprobs) == len(o.outputs[0].token_ids)


@pytest.mark.parametrize(("so", "message"), [
    (StructuredOutputsParams(regex="a(b"), "unclosed group"),
    (StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "strin"}}}),
     "strin"),
    (StructuredOutputsParams(grammar="start: undefined_rule"), "undefined_rule"),
])
def test_compile_errors_raise_with_the_backend_message(llm, so, message):
    with pytest.raises(ValueError, match=message):
        llm.generate(["x"], SamplingParams(structured_outputs=so), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_compile_cache_reuses_by_spec(llm):
    compiler = llm.llm_engine.structured_output.compiler
    schema = {"type": "object", "properties": {"k": {"type": "boolean"}}, "required": ["k"]}
    llm.generate(["a"], _params(StructuredOutputsParams(json=schema), 0.0, None), use_tqdm=False)
    size = len(compiler._cache)
    llm.generate(["b"], _params(StructuredOutputsParams(json=json.dumps(schema)), 0.0, None),
                 use_tqdm=False)
    assert len(compiler._cache) == size
