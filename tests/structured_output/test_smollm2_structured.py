"""Structured output with the real SmolLM2 (its GGUF tokenizer through llguidance): a chat
extraction answer validates and carries the facts of the prompt; choice picks a label."""

from __future__ import annotations

import json

import jsonschema
import pytest

from pagedllm import LLM, SamplingParams, StructuredOutputsParams

pytestmark = pytest.mark.slow

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "job": {"type": "string", "maxLength": 40}},
    "required": ["name", "age", "job"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(kv_cache_memory=64 * 2**20, max_model_len=512, num_threads=1)


def test_smollm2_json_extraction_and_choice(llm):
    msg = [{"role": "user", "content": "Extract name, age and job as JSON: Ada Lovelace is a "
                                       "36 year old mathematician."}]
    params = [SamplingParams(temperature=t, seed=s, max_tokens=80,
                             structured_outputs=StructuredOutputsParams(json=PERSON))
              for t, s in ((0.0, None), (1.0, 1), (1.0, 2))]
    outs = llm.chat([msg] * 3, params, use_tqdm=False)
    for o in outs:
        assert o.outputs[0].finish_reason == "stop", o.outputs[0].text
        value = json.loads(o.outputs[0].text)
        jsonschema.validate(value, PERSON)
    greedy = json.loads(outs[0].outputs[0].text)
    assert "Ada" in greedy["name"]
    label = llm.chat([{"role": "user", "content": "Is the sky blue? Answer yes or no."}],
                     SamplingParams(temperature=0, max_tokens=5, structured_outputs=(
                         StructuredOutputsParams(choice=["yes", "no"]))), use_tqdm=False)
    assert label[0].outputs[0].text in ("yes", "no")
