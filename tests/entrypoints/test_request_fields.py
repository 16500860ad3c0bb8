"""Request-field rules without a server: declared-but-unimplemented fields are 400 unless
neutral, unknown extras only warn, and the ways of asking for structured output map to one
StructuredOutputsParams (or a 400 when they conflict)."""

from __future__ import annotations

import logging

import pytest

from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.protocol import ChatCompletionRequest, CompletionRequest
from pagedllm.entrypoints.request_fields import (
    check_request_fields,
    logit_bias_of,
    structured_outputs_of,
)


@pytest.mark.parametrize("cls", [CompletionRequest, ChatCompletionRequest])
def test_every_listed_field_is_declared(cls):
    for name in (*cls.UNSUPPORTED, *cls.IGNORED):
        assert name in cls.model_fields, name


def test_neutral_values_pass_and_others_are_400(caplog):
    ok = CompletionRequest(prompt="x", use_beam_search=False, length_penalty=1.0, user="u",
                           guided_decoding_backend="xgrammar")
    with caplog.at_level(logging.WARNING):
        check_request_fields(ok)
    assert "unknown" not in caplog.text
    with pytest.raises(APIError) as e:
        check_request_fields(_chat(use_beam_search=True))  # completions implement it
    assert e.value.param == "use_beam_search" and e.value.status == 400
    with caplog.at_level(logging.WARNING):
        check_request_fields(CompletionRequest(prompt="x", zebra=1, apple=2))
    assert "ignoring unknown request fields: apple, zebra" in caplog.text


def _chat(**kw):
    return ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], **kw)


def test_structured_output_sources():
    assert structured_outputs_of(_chat()) is None
    assert structured_outputs_of(_chat(response_format={"type": "text"})) is None
    assert structured_outputs_of(_chat(response_format={"type": "json_object"})).json_object
    so = structured_outputs_of(_chat(response_format={
        "type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}))
    assert so.json == {"type": "object"}
    assert structured_outputs_of(_chat(structured_outputs={"regex": "a+"})).regex == "a+"
    so = structured_outputs_of(_chat(guided_json={"type": "object"},
                                     guided_whitespace_pattern=" ?"))
    assert so.json == {"type": "object"} and so.whitespace_pattern == " ?"
    with pytest.raises(APIError, match="only one"):
        structured_outputs_of(_chat(structured_outputs={"regex": "a"}, guided_regex="b"))
    with pytest.raises(APIError, match="needs json_schema"):
        structured_outputs_of(_chat(response_format={"type": "json_schema"}))


def test_logit_bias_keys():
    assert logit_bias_of(_chat(logit_bias={"5": 2.0})) == {5: 2.0}
    with pytest.raises(APIError) as e:
        logit_bias_of(_chat(logit_bias={"five": 2.0}))
    assert e.value.param == "logit_bias"
