"""ChatOptions and its `serve` flags: vLLM's names and forms, checked before any model loads."""

from __future__ import annotations

import pytest

from pagedllm.entrypoints.chat_options import ChatOptions
from pagedllm.entrypoints.cli import build_parser
from pagedllm.entrypoints.tool_parsers import TOOL_PARSERS


def _options(*flags: str) -> ChatOptions:
    return ChatOptions.from_args(build_parser().parse_args(["serve", "m", *flags]))


def test_strict_schemas_by_default_and_both_switch_forms():
    assert _options().disable_additional_properties is True
    off = '{"disable_additional_properties": false}'
    assert _options("--structured-outputs-config", off).disable_additional_properties is False
    dotted = "--structured-outputs-config.disable_additional_properties"
    assert _options(dotted, "false").disable_additional_properties is False
    # the dotted form wins over the JSON
    both = _options("--structured-outputs-config", off, dotted, "true")
    assert both.disable_additional_properties is True
    assert (
        _options("--structured-outputs-config", '{"backend": "guidance"}').tool_call_parser is None
    )


@pytest.mark.parametrize(
    "flags",
    [
        ["--structured-outputs-config", '{"backend": "xgrammar"}'],
        ["--structured-outputs-config", '{"disable_any_whitespace": true}'],
        ["--structured-outputs-config", '{"disable_additional_properties": "no"}'],
        ["--structured-outputs-config", "[1]"],
        ["--structured-outputs-config.disable_additional_properties", "maybe"],
        ["--tool-call-parser", "nope"],
    ],
)
def test_bad_flags_are_refused_by_the_parser(flags, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", *flags])
    assert "error" in capsys.readouterr().err


def test_tool_call_parser_choices_are_the_registry():
    for name in TOOL_PARSERS:
        assert _options("--tool-call-parser", name).tool_call_parser == name
    with pytest.raises(ValueError, match="unknown tool call parser 'nope'"):
        ChatOptions(tool_call_parser="nope")


def test_reasoning_parser_flag_is_the_registry():
    assert _options().reasoning_parser is None
    assert _options("--reasoning-parser", "qwen3").reasoning_parser == "qwen3"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--reasoning-parser", "nope"])
    with pytest.raises(ValueError, match="unknown reasoning parser 'nope'"):
        ChatOptions(reasoning_parser="nope")
