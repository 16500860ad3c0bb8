"""ChoiceText: the reasoning comes off first, tool parsing sees only the answer; streamed
deltas (split anywhere) reassemble to the whole message."""

from __future__ import annotations

import json

import pytest

from pagedllm.entrypoints.chat_choice import ChoiceText
from pagedllm.entrypoints.chat_options import ChatOptions
from pagedllm.entrypoints.chat_reasoning import ReasoningPlan
from pagedllm.entrypoints.protocol import ChatCompletionRequest
from pagedllm.entrypoints.reasoning_parsers import REASONING_PARSERS
from pagedllm.entrypoints.tool_calls import plan_tools

TOOL = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    },
}
# the thinking mentions a call; only the one in the answer is real
TEXT = (
    'I could write <tool_call>{"name": "f", "arguments": {"a": 0}}</tool_call>.\n'
    '</think>\n\nCalling. <tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
)


def _plans(tool_choice="auto", include=True):
    req = ChatCompletionRequest(
        messages=[{"role": "user", "content": "x"}], tools=[TOOL], tool_choice=tool_choice
    )
    tools = plan_tools(req, ChatOptions("hermes", enable_auto_tool_choice=True))
    reasoning = ReasoningPlan(REASONING_PARSERS["deepseek_r1"], True, None, None, include)
    return tools, reasoning


def _streamed(tools, reasoning, pieces):
    """Reassemble the deltas as a client does, checking OpenAI's shape on the way: one entry
    per call index per chunk, id and name in an index's first entry only."""
    choice, out = ChoiceText(tools, reasoning), {"reasoning": "", "content": "", "calls": []}
    calls: dict[int, dict] = {}
    for k, piece in enumerate(pieces):
        d = choice.delta(piece, k == len(pieces) - 1).model_dump()
        out["reasoning"] += d.get("reasoning_content") or ""
        out["content"] += d.get("content") or ""
        entries = d.get("tool_calls") or []
        assert len({e["index"] for e in entries}) == len(entries)
        for e in entries:
            first = e["index"] not in calls
            assert ("id" in e) is first and ("name" in e["function"]) is first
            call = calls.setdefault(e["index"], {"name": e["function"].get("name"), "args": ""})
            call["args"] += e["function"].get("arguments", "")
    out["calls"] = [(calls[i]["name"], json.loads(calls[i]["args"])) for i in sorted(calls)]
    return out


def test_tools_are_parsed_from_the_answer_only():
    tools, reasoning = _plans()
    msg = ChoiceText(tools, reasoning).message(TEXT)
    assert msg.reasoning_content == msg.reasoning and msg.reasoning.startswith("I could")
    assert msg.content == "Calling."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == [
        ("f", {"a": 1})
    ]
    for cut in range(1, len(TEXT), 7):
        got = _streamed(tools, reasoning, [TEXT[:cut], TEXT[cut:]])
        assert got == {
            "reasoning": msg.reasoning,
            "content": "\n\nCalling. ",
            "calls": [("f", {"a": 1})],
        }, cut


@pytest.mark.parametrize("include", [True, False])
def test_named_call_opens_after_the_thinking(include):
    tools, reasoning = _plans({"type": "function", "function": {"name": "f"}}, include)
    choice = ChoiceText(tools, reasoning)
    first = choice.delta("thinking...", False).model_dump()
    assert "tool_calls" not in first and "content" not in first
    assert (first.get("reasoning_content") == "thinking...") is include
    opened = choice.delta('</think>{"a": ', False).model_dump()
    (call,) = opened["tool_calls"]
    assert call["id"] and call["function"] == {"name": "f", "arguments": '{"a": '}
    assert choice.delta("2}", True).model_dump()["tool_calls"] == [
        {"index": 0, "function": {"arguments": "2}"}}
    ]


def test_required_calls_stream_their_parameters():
    tools, _ = _plans("required")
    text = '[{"name": "f", "parameters": {"a": 1}}, {"name": "f", "parameters": {"a": 22}}]'
    whole = ChoiceText(tools, None).message(text)
    want = [(c.function.name, json.loads(c.function.arguments)) for c in whole.tool_calls]
    assert want == [("f", {"a": 1}), ("f", {"a": 22})]
    got = _streamed(tools, None, list(text))  # a character per step
    assert got["calls"] == want and got["content"] == ""
