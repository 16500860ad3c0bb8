"""How /v1/chat/completions reads a model's output (`ChatOptions`) and their `serve` flags
(vLLM's names): which tool-call parser `tool_choice="auto"` uses, which reasoning parser
splits thinking from the answer (chat_reasoning.py), and whether tool calls and
`strict: true` JSON schemas are compiled strictly (no undeclared object keys, see
structured_output/strict_schema.py).

    --enable-auto-tool-choice --tool-call-parser NAME       NAME: a key of TOOL_PARSERS
    --reasoning-parser NAME                                 NAME: a key of REASONING_PARSERS
    --structured-outputs-config '{"disable_additional_properties": false}'   spec-exact schemas
    --structured-outputs-config.disable_additional_properties false          (the same)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from pagedllm.entrypoints.reasoning_parsers import REASONING_PARSERS
from pagedllm.entrypoints.tool_parsers import TOOL_PARSERS

# --structured-outputs-config keys: llguidance is the one backend (vLLM's "guidance").
_BACKENDS = ("auto", "guidance")


@dataclass(frozen=True)
class ChatOptions:
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    # True (default): tool calls and strict json_schema formats admit no undeclared keys
    # where the schema says nothing of additionalProperties; False: JSON Schema to the letter.
    disable_additional_properties: bool = True
    reasoning_parser: str | None = None

    def __post_init__(self) -> None:
        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_PARSERS:
            raise ValueError(
                f"unknown tool call parser {self.tool_call_parser!r}; known: "
                f"{', '.join(sorted(TOOL_PARSERS))}"
            )
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"unknown reasoning parser {self.reasoning_parser!r}; known: "
                f"{', '.join(sorted(REASONING_PARSERS))}"
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ChatOptions:
        so = args.structured_outputs_config or {}
        dotted = args.structured_outputs_disable_additional_properties
        strict = so.get("disable_additional_properties", True) if dotted is None else dotted
        return cls(
            tool_call_parser=args.tool_call_parser,
            enable_auto_tool_choice=args.enable_auto_tool_choice,
            disable_additional_properties=strict,
            reasoning_parser=args.reasoning_parser,
        )


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def parse_structured_outputs_config(text: str) -> dict:
    """vLLM's JSON form; known keys: disable_additional_properties (bool), backend."""
    try:
        spec = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--structured-outputs-config is JSON, got {text!r}"
        ) from None
    if not isinstance(spec, dict):
        raise argparse.ArgumentTypeError("--structured-outputs-config must be a JSON object")
    unknown = sorted(set(spec) - {"disable_additional_properties", "backend"})
    if unknown:
        raise argparse.ArgumentTypeError(
            f"--structured-outputs-config: unsupported keys {', '.join(unknown)} (supported: "
            "disable_additional_properties, backend)"
        )
    if not isinstance(spec.get("disable_additional_properties", True), bool):
        raise argparse.ArgumentTypeError(
            "--structured-outputs-config: disable_additional_properties must be true or false"
        )
    if spec.get("backend", "auto") not in _BACKENDS:
        raise argparse.ArgumentTypeError(
            f"--structured-outputs-config: backend {spec['backend']!r} is not available (this "
            f"server's grammar engine is llguidance: {', '.join(_BACKENDS)})"
        )
    return spec


def add_chat_option_args(g: argparse._ArgumentGroup) -> None:
    """The `serve` flags of ChatOptions (into the "server" group)."""
    g.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='allow tool_choice "auto": the model decides, --tool-call-parser reads '
        "its calls (required / named choices work without it)",
    )
    g.add_argument(
        "--tool-call-parser",
        default=None,
        choices=sorted(TOOL_PARSERS),
        help="format of the model's tool calls for tool_choice auto",
    )
    g.add_argument(
        "--reasoning-parser",
        default=None,
        choices=sorted(REASONING_PARSERS),
        help="split the model's thinking into reasoning_content (and `reasoning`); "
        "structured output and tool calls then start after it, thinking_token_budget caps it",
    )
    g.add_argument(
        "--structured-outputs-config",
        type=parse_structured_outputs_config,
        default=None,
        metavar="JSON",
        help='vLLM\'s structured output settings: {"disable_additional_properties": '
        "false} compiles tool calls and strict json_schema formats to the letter of "
        "JSON Schema (undeclared keys allowed where the schema does not forbid "
        'them); default true, as vLLM\'s default backend; "backend": auto | guidance',
    )
    g.add_argument(
        "--structured-outputs-config.disable_additional_properties",
        dest="structured_outputs_disable_additional_properties",
        type=parse_bool,
        default=None,
        metavar="BOOL",
        help="the same setting in vLLM's dotted form (overrides the JSON)",
    )
