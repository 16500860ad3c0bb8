"""gpt-oss's harmony format (OpenAI's documented examples, adapted): the gpt_oss reasoning
parser takes the analysis channel, the gpt_oss tool parser the `to=functions.NAME` messages;
whole and streamed in every split, alone and together, give the same message."""

from __future__ import annotations

import json

import pytest

from pagedllm.entrypoints.chat_choice import ChoiceText
from pagedllm.entrypoints.chat_options import ChatOptions
from pagedllm.entrypoints.chat_reasoning import ReasoningPlan
from pagedllm.entrypoints.protocol import ChatCompletionRequest
from pagedllm.entrypoints.reasoning_parsers import REASONING_PARSERS
from pagedllm.entrypoints.tool_calls import plan_tools

TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("get_weather", "get_time")
]
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}'
)
# (output, reasoning, content, calls)
CASES = [
    (
        "<|channel|>analysis<|message|>User asks if 7 is prime. It is.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Yes, 7 is prime.",
        "User asks if 7 is prime. It is.",
        "Yes, 7 is prime.",
        [],
    ),
    (
        "<|channel|>analysis<|message|>Need the weather.<|end|>" + CALL,
        "Need the weather.",
        "",
        [("get_weather", {"city": "Paris"})],
    ),
    # a preamble to the user, then a call whose recipient is in the role part
    (
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant "
        'to=functions.get_time<|channel|>commentary json<|message|>{"zone": "CET"}<|call|>',
        "",
        "Let me check.",
        [("get_time", {"zone": "CET"})],
    ),
    ("<|channel|>analysis<|message|>Thinking about 7 <|en", "Thinking about 7 <|en", "", []),
    # a built-in tool's message is not a function call
    (
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary "
        'to=browser.search<|message|>{"query": "7"}',
        "x",
        '{"query": "7"}',
        [],
    ),
]


def _plans():
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=TOOLS)
    tools = plan_tools(req, ChatOptions("gpt_oss", enable_auto_tool_choice=True))
    reasoning = ReasoningPlan(REASONING_PARSERS["gpt_oss"], False, None, None, True)
    return tools, reasoning


def _streamed(pieces):
    tools, reasoning = _plans()
    choice, r, c, calls = ChoiceText(tools, reasoning), "", "", {}
    for k, piece in enumerate(pieces):
        d = choice.delta(piece, k == len(pieces) - 1).model_dump()
        r += d.get("reasoning_content") or ""
        c += d.get("content") or ""
        for e in d.get("tool_calls") or []:
            call = calls.setdefault(e["index"], [e["function"].get("name"), ""])
            call[1] += e["function"].get("arguments", "")
    return r, c, [(n, json.loads(a)) for n, a in (calls[i] for i in sorted(calls))]


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), CASES)
def test_harmony_whole_and_streamed(text, reasoning, content, calls):
    tools, plan = _plans()
    msg = ChoiceText(tools, plan).message(text)
    assert (msg.reasoning_content or "") == reasoning
    assert (msg.content or "") == content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls] == calls
    for cut in range(1, len(text)):
        assert _streamed([text[:cut], text[cut:]]) == (reasoning, content, calls), cut
    assert _streamed(list(text)) == (reasoning, content, calls)


def test_tool_parser_alone_keeps_the_analysis_as_content():
    from pagedllm.entrypoints.tool_parsers import TOOL_PARSERS

    out = TOOL_PARSERS["gpt_oss"].parse("<|channel|>analysis<|message|>Hm.<|end|>" + CALL, TOOLS)
    assert out.content == "Hm."
    assert [(c.name, json.loads(c.arguments)) for c in out.calls] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_reasoning_tokens_from_the_text_when_markers_are_not_single_tokens(tiny_tokenizer):
    plan = ReasoningPlan(REASONING_PARSERS["gpt_oss"], False, None, None, True, tiny_tokenizer)
    text = "<|channel|>analysis<|message|>odd and small<|end|>"
    ids = tiny_tokenizer.encode(
        text + "<|start|>assistant<|channel|>final<|message|>Yes", add_special_tokens=False
    )
    want = len(tiny_tokenizer.encode("odd and small", add_special_tokens=False))
    assert plan.reasoning_tokens(ids) == want


def test_budget_and_grammar_are_refused_for_multi_token_markers(tiny_tokenizer):
    from pagedllm.entrypoints.chat_reasoning import plan_reasoning
    from pagedllm.entrypoints.errors import APIError

    ids = tiny_tokenizer.encode("<|start|>assistant", add_special_tokens=False)
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}])
    plan, thinking = plan_reasoning(req, "gpt_oss", tiny_tokenizer, ids, grammar=False)
    assert plan is not None and thinking is None  # plain requests are split, nothing else
    with pytest.raises(APIError, match="not single tokens"):
        plan_reasoning(req, "gpt_oss", tiny_tokenizer, ids, grammar=True)
    budget = ChatCompletionRequest(
        messages=[{"role": "user", "content": "x"}], thinking_token_budget=4
    )
    with pytest.raises(APIError, match="not single tokens") as err:
        plan_reasoning(budget, "gpt_oss", tiny_tokenizer, ids, grammar=False)
    assert err.value.param == "thinking_token_budget"
