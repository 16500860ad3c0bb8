"""Tool-call parsers and tool_choice planning, without a server: streamed in any chunking,
the parsers give what they give on the whole text."""

from __future__ import annotations

import json

import pytest

from pagedllm.entrypoints.chat_options import ChatOptions
from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.protocol import ChatCompletionRequest
from pagedllm.entrypoints.tool_calls import plan_tools
from pagedllm.entrypoints.tool_parsers import TOOL_PARSERS

TEXTS = {
    "hermes": [
        (
            'Let me check. <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>\n'
            '<tool_call>{"name": "g", "arguments": {"b": "x</tool_call>"}}</tool_call>',
            "Let me check. ",
            [("f", {"a": 1}), ("g", {"b": "x</tool_call>"})],
        ),
        ("Just text, with a < sign and <tool", "Just text, with a < sign and <tool", []),
        ('<tool_call>{"name": "f", "arguments": {}}', "", [("f", {})]),  # unclosed at the end
        ("x <tool_call>{not json}</tool_call> y", "x <tool_call>{not json}</tool_call> y", []),
        (
            '<tool_call>{"name": "f", "arguments": "{\\"k\\": 2}"}</tool_call>',
            "",
            [("f", {"k": 2})],
        ),
    ],
    "llama3_json": [
        ('{"name": "f", "parameters": {"a": 1}}', "", [("f", {"a": 1})]),
        (
            '<|python_tag|>{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"z": 0}}',
            "",
            [("f", {}), ("g", {"z": 0})],
        ),
        ("Hello {there}", "Hello {there}", []),
        ('{"name": "f", "parameters": ', '{"name": "f", "parameters": ', []),
    ],
}


@pytest.mark.parametrize("parser", sorted(TEXTS))
def test_parsers_whole_and_streamed(parser):
    cls = TOOL_PARSERS[parser]
    for text, content, calls in TEXTS[parser]:
        whole = cls.parse(text)
        assert whole.content == content
        assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == calls
        for size in (1, 2, 5):
            p, got_content, got_calls = cls(), "", []
            for i in range(0, len(text), size):
                r = p.feed(text[i : i + size])
                got_content += r.content
                got_calls += r.calls
            r = p.finish()
            assert got_content + r.content == content
            assert got_calls + r.calls == whole.calls


def _req(**kw) -> ChatCompletionRequest:
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
    return ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=[tool], **kw)


def test_plan_tools():
    off, hermes = ChatOptions(), ChatOptions("hermes", enable_auto_tool_choice=True)
    assert plan_tools(_req(tool_choice="none"), off).mode == "none"
    with pytest.raises(APIError, match="enable-auto-tool-choice"):
        plan_tools(_req(), off)  # tools without tool_choice mean auto
    assert plan_tools(_req(), hermes).parser is TOOL_PARSERS["hermes"]
    plan = plan_tools(_req(tool_choice="required", parallel_tool_calls=False), off)
    schema = plan.structured.json
    assert schema["minItems"] == 1 and schema["maxItems"] == 1
    assert schema["items"]["properties"]["name"]["enum"] == ["f"]
    text = '[{"name": "f", "parameters": {"a": 3}}, {"name": "f", "parameters": {}}]'
    assert [(c.name, c.arguments) for c in plan.parse(text).calls] == [
        ("f", '{"a": 3}'),
        ("f", "{}"),
    ]
    named = plan_tools(_req(tool_choice={"type": "function", "function": {"name": "f"}}), off)
    assert named.structured.json["properties"]["a"] == {"type": "integer"}
    assert named.structured.json["additionalProperties"] is False  # strict by default
    exact = ChatOptions(disable_additional_properties=False)
    named = plan_tools(_req(tool_choice={"type": "function", "function": {"name": "f"}}), exact)
    assert "additionalProperties" not in named.structured.json
    assert [(c.name, c.arguments) for c in named.parse('{"a": 1}').calls] == [("f", '{"a": 1}')]
