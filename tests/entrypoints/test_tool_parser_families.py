"""The tool parsers of issue 32 on outputs written from each family's documented format
(Qwen3-Coder's chat template, Mistral's tokenizer versions, Llama 3.2 / 4's pythonic prompt
format, DeepSeek V3 / V3.1's templates): whole, and streamed in every two-way split and in
small chunks, which must give the same content and calls."""

from __future__ import annotations

import json

import pytest

from pagedllm.entrypoints.tool_parsers import TOOL_PARSERS, ToolParser
from pagedllm.entrypoints.tool_parsers.base import register_tool_parser

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "hours": {"type": "array"},
                    "extra": {"type": "object"},
                    "ratio": {"type": "number"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
        },
    },
]

QWEN3_CODER = (
    "I'll check both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n"
    "<parameter=hours>\n[9, 12]\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n"
    "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\n"
    "0800 <UTC>\n</parameter>\n</function>\n</tool_call>"
)
DS_V3 = (
    "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
    '```json\n{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>'
    'function<｜tool▁sep｜>get_time\n```json\n{"zone": "CET"}\n```<｜tool▁call▁end｜>'
    "<｜tool▁calls▁end｜>"
)
DS_V31 = (
    '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)

PARIS = ("get_weather", {"city": "Paris"})
# parser -> [(model output, content, calls)]
CASES = {
    "qwen3_coder": [
        (
            QWEN3_CODER,
            "I'll check both.\n",
            [
                (
                    "get_weather",
                    {
                        "city": "San Francisco",
                        "days": 3,
                        "metric": True,
                        "hours": [9, 12],
                        "ratio": 0.5,
                    },
                ),
                ("get_time", {"zone": "0800 <UTC>"}),
            ],
        ),
        ("No tools needed: 2 < 3.", "No tools needed: 2 < 3.", []),
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "</function>",
            "",
            [PARIS],
        ),  # unclosed </tool_call> at the end
        (
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
            [],
        ),  # cut off
    ],
    "mistral": [
        (
            'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
            '{"name": "get_time", "arguments": {"zone": "[UTC]"}}]',
            "Sure. ",
            [PARIS, ("get_time", {"zone": "[UTC]"})],
        ),
        (
            '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]'
            '{"zone": "CET"}',
            "",
            [PARIS, ("get_time", {"zone": "CET"})],
        ),
        ('[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}', "", [PARIS]),
        ("Plain [text] answer", "Plain [text] answer", []),
        ("[TOOL_CALLS]not a call", "[TOOL_CALLS]not a call", []),
    ],
    "pythonic": [
        (
            '[get_weather(city="Paris"), get_time(zone="UTC+1 (x)")]',
            "",
            [PARIS, ("get_time", {"zone": "UTC+1 (x)"})],
        ),
        (
            "<|python_start|>[get_weather(city='Paris', days=2, extra={'a': [1, (2)]})]"
            "<|python_end|>",
            "",
            [("get_weather", {"city": "Paris", "days": 2, "extra": {"a": [1, 2]}})],
        ),
        ("The answer is [1, 2].", "The answer is [1, 2].", []),
        ("[1, 2, 3]", "[1, 2, 3]", []),
        ('[get_weather(city="Par', '[get_weather(city="Par', []),
    ],
    "deepseek_v3": [
        (
            DS_V3,
            "Let me look.",
            [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"zone": "CET"})],
        ),
        (DS_V31, "", [PARIS]),
        ("Nothing to call.", "Nothing to call.", []),
        ("<｜tool▁calls▁begin｜>oops", "<｜tool▁calls▁begin｜>oops", []),
    ],
}


def _run(cls: type[ToolParser], pieces: list[str]) -> tuple[str, list]:
    parser, content, calls = cls(TOOLS), "", []
    for piece in pieces:
        out = parser.feed(piece)
        content += out.content
        calls += out.calls
    out = parser.finish()
    return content + out.content, calls + out.calls


@pytest.mark.parametrize(
    ("parser", "text", "content", "calls"),
    [(p, *case) for p, cases in CASES.items() for case in cases],
)
def test_family_outputs_whole_and_streamed(parser, text, content, calls):
    cls = TOOL_PARSERS[parser]
    whole = cls.parse(text, TOOLS)
    assert whole.content == content
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == calls
    want = (whole.content, whole.calls)
    for cut in range(1, len(text)):  # every two-way split: markers and JSON cut anywhere
        assert _run(cls, [text[:cut], text[cut:]]) == want, cut
    for size in (1, 2, 3, 7):
        assert _run(cls, [text[i : i + size] for i in range(0, len(text), size)]) == want


def test_calls_stream_as_each_closes():
    parser = TOOL_PARSERS["pythonic"](TOOLS)
    first = parser.feed('[get_weather(city="Paris"), get_ti')
    assert [c.name for c in first.calls] == ["get_weather"]
    assert [c.name for c in parser.feed('me(zone="CET")]').calls] == ["get_time"]
    assert parser.finish().calls == []


def test_registry_takes_a_new_parser_class_and_refuses_a_taken_name():
    class Echo(ToolParser):
        name = "test_echo_parser"

    try:
        assert register_tool_parser(Echo) is Echo
        assert TOOL_PARSERS["test_echo_parser"] is Echo
        with pytest.raises(ValueError, match="taken"):
            register_tool_parser(Echo)
    finally:
        TOOL_PARSERS.pop("test_echo_parser", None)
    assert {"hermes", "llama3_json", "qwen3_coder", "mistral", "pythonic", "deepseek_v3"} <= set(
        TOOL_PARSERS
    )


HERMES = (
    'Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
    '</tool_call><tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>'
)
TEXTS_LLAMA = (
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
    '{"name": "get_time", "parameters": {"zone": "CET"}}'
)
STREAMED = {  # parser -> (output, does it stream arguments before the call closes)
    "hermes": (HERMES, True),
    "mistral": (CASES["mistral"][0][0], True),
    "mistral_v11": (CASES["mistral"][1][0], True),
    "deepseek_v3": (DS_V3, True),
    "deepseek_v31": (DS_V31, True),
    "qwen3_coder": (QWEN3_CODER, True),  # parameter by parameter
    "pythonic": (CASES["pythonic"][0][0], True),  # keyword by keyword
    "llama3_json": (TEXTS_LLAMA, True),
}


@pytest.mark.parametrize("case", sorted(STREAMED))
def test_streamed_entries_reassemble_to_the_whole_calls(case, caplog):
    from pagedllm.entrypoints.chat_choice import ChoiceText
    from pagedllm.entrypoints.chat_options import ChatOptions
    from pagedllm.entrypoints.protocol import ChatCompletionRequest
    from pagedllm.entrypoints.tool_calls import plan_tools

    text, incremental = STREAMED[case]
    name = case.removesuffix("_v11").replace("deepseek_v31", "deepseek_v3")
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], tools=TOOLS)
    plan = plan_tools(req, ChatOptions(name, enable_auto_tool_choice=True))
    whole = ChoiceText(plan, None).message(text)
    want = [(c.function.name, c.function.arguments) for c in whole.tool_calls]
    assert want
    for size in (1, 4, 9):
        choice, calls, pieces = ChoiceText(plan, None), {}, 0
        chunks = [text[i : i + size] for i in range(0, len(text), size)]
        for k, chunk in enumerate(chunks):
            d = choice.delta(chunk, k == len(chunks) - 1).model_dump()
            entries = d.get("tool_calls") or []
            assert len({e["index"] for e in entries}) == len(entries)
            for e in entries:
                first = e["index"] not in calls
                assert ("id" in e) is first and ("name" in e["function"]) is first
                call = calls.setdefault(e["index"], [e["function"].get("name"), ""])
                call[1] += e["function"].get("arguments", "")
                pieces += 1
        assert [tuple(calls[i]) for i in sorted(calls)] == want, size
        if size == 1:  # arguments arrived in several entries, or each call in one
            assert (pieces > len(want)) is incremental
    assert "differ from those streamed" not in caplog.text
