"""Reasoning parsers on recorded outputs (thinking present, absent, unterminated, opened by
the prompt or by the output): whole, and streamed in every two-way split and small chunks,
which must give the same reasoning and content; the per-request rules (enable_thinking,
the prompt's open `<think>`), token counting and the registry."""

from __future__ import annotations

import pytest

from pagedllm.entrypoints.chat_reasoning import ReasoningPlan
from pagedllm.entrypoints.reasoning_parsers import (
    REASONING_PARSERS,
    ReasoningParser,
    register_reasoning_parser,
)

R1_PROMPT = "<｜User｜>Is 7 prime?<｜Assistant｜><think>\n"
QWEN3_PROMPT = "<|im_start|>user\nIs 7 prime?<|im_end|>\n<|im_start|>assistant\n"
QWEN3_OFF = QWEN3_PROMPT + "<think>\n\n</think>\n\n"

# (parser, prompt tail, output, reasoning, content)
CASES = [
    # DeepSeek-R1 distills: the template opened <think>; the output closes it
    (
        "deepseek_r1",
        R1_PROMPT,
        "7 has no divisors but 1 and 7.\n</think>\n\nYes, 7 is prime.",
        "7 has no divisors but 1 and 7.\n",
        "\n\nYes, 7 is prime.",
    ),
    # early R1 builds open <think> themselves
    ("deepseek_r1", "<｜Assistant｜>", "<think>\nsmall</think>Yes.", "\nsmall", "Yes."),
    # never closed (cut by max_tokens): all reasoning
    ("deepseek_r1", R1_PROMPT, "Let me check 2, 3, 5 <thin", "Let me check 2, 3, 5 <thin", ""),
    ("deepseek_r1", R1_PROMPT, "</think>Yes.", "", "Yes."),  # empty thinking
    # Qwen3 hybrid: thinking on, the output opens it
    (
        "qwen3",
        QWEN3_PROMPT,
        "<think>\nOdd, small.\n</think>\n\nYes: 7 is prime.",
        "\nOdd, small.\n",
        "\n\nYes: 7 is prime.",
    ),
    # thinking on but the model opens none: all content
    (
        "qwen3",
        QWEN3_PROMPT,
        "Yes, <think> is just a word here.",
        "",
        "Yes, <think> is just a word here.",
    ),
    # Qwen3 thinking variants: the template opened it
    ("qwen3", QWEN3_PROMPT + "<think>\n", "odd</think>\n\nYes.", "odd", "\n\nYes."),
    ("qwen3", QWEN3_PROMPT, "<think>\nunterminated 1 < 2", "\nunterminated 1 < 2", ""),
    # enable_thinking false: the template closed an empty block in the prompt
    ("qwen3", QWEN3_OFF, "Yes.", "", "Yes."),
]


def _stream(parser: ReasoningParser, pieces: list[str]) -> tuple[str, str]:
    reasoning = content = ""
    for piece in pieces:
        out = parser.feed(piece)
        reasoning, content = reasoning + out.reasoning, content + out.content
    out = parser.finish()
    return reasoning + out.reasoning, content + out.content


@pytest.mark.parametrize(("name", "prompt", "text", "reasoning", "content"), CASES)
def test_recorded_outputs_whole_and_streamed(name, prompt, text, reasoning, content):
    cls = REASONING_PARSERS[name]

    def fresh() -> ReasoningParser:
        return cls.for_request(prompt, {})

    assert _stream(fresh(), [text]) == (reasoning, content)
    for cut in range(1, len(text)):  # markers split at every point
        assert _stream(fresh(), [text[:cut], text[cut:]]) == (reasoning, content), cut
    for size in (1, 2, 3):
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        assert _stream(fresh(), pieces) == (reasoning, content)


def test_reasoning_streams_before_the_end_marker_arrives():
    parser = REASONING_PARSERS["deepseek_r1"].for_request(R1_PROMPT, None)
    assert parser.feed("Odd, and ").reasoning == "Odd, and "
    held = parser.feed("small</th")  # "</th" may start the end marker: held back
    assert (held.reasoning, held.content) == ("small", "")
    done = parser.feed("ink>Yes")
    assert (done.reasoning, done.content) == ("", "Yes")


def test_qwen3_enable_thinking_false_turns_parsing_off():
    qwen3 = REASONING_PARSERS["qwen3"]
    assert qwen3.for_request(QWEN3_OFF, {"enable_thinking": False}) is None
    assert qwen3.for_request(QWEN3_PROMPT, {"enable_thinking": True}) is not None
    assert qwen3.for_request(QWEN3_PROMPT, None).state == "maybe"
    assert REASONING_PARSERS["deepseek_r1"].for_request("x", {"enable_thinking": False})


def test_reasoning_tokens_count_the_thinking_only():
    start, end = 90, 91
    r1 = ReasoningPlan(REASONING_PARSERS["deepseek_r1"], True, start, end, True)
    assert r1.reasoning_tokens([5, 6, 7, end, 8]) == 3
    assert r1.reasoning_tokens([start, 5, end, 8]) == 1
    assert r1.reasoning_tokens([5, 6]) == 2  # unterminated
    maybe = ReasoningPlan(REASONING_PARSERS["qwen3"], False, start, end, True)
    assert maybe.reasoning_tokens([5, 6, end]) == 0  # never opened
    assert maybe.reasoning_tokens([start, 5, 6, end, 7]) == 2


def test_registry():
    class Other(ReasoningParser):
        name = "test_other_reasoning"

    try:
        assert register_reasoning_parser(Other) is Other
        with pytest.raises(ValueError, match="taken"):
            register_reasoning_parser(Other)
    finally:
        REASONING_PARSERS.pop("test_other_reasoning", None)
    assert {"deepseek_r1", "qwen3"} <= set(REASONING_PARSERS)
