"""Tool calling on /v1/chat/completions: what `tool_choice` asks of the engine, and how a
choice's text becomes OpenAI `tool_calls` (whole, or as streamed deltas).

    tool_choice   prompt          decoding                         text -> tool_calls
    none          tools rendered  free                              none (plain content)
    auto          tools rendered  free                              --tool-call-parser
    required      tools rendered  JSON schema: [{"name", "parameters"}, ...] (minItems 1)
    named         tools rendered  JSON schema: that tool's parameters  one call, text = arguments

`required` and named calls are enforced by structured output from the tools' schemas (as vLLM
does), so they are valid even from a model that knows nothing about tools. Those schemas, and a
`strict: true` json_schema response format, are compiled strictly by default: an object that
says nothing of `additionalProperties` admits no undeclared key (structured_output/
strict_schema.py; `ChatOptions.disable_additional_properties`). `parallel_tool_calls: false`
holds in every mode: `required` allows one array element, a named choice is one call anyway,
and `auto` keeps the first call the model writes (later ones are dropped, as vLLM does).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from pagedllm.entrypoints.chat_options import ChatOptions
from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    FunctionCall,
    ToolCall,
)
from pagedllm.entrypoints.request_fields import structured_outputs_of
from pagedllm.entrypoints.tool_parsers import TOOL_PARSERS, ParsedToolCall, ParseResult, ToolParser
from pagedllm.entrypoints.tool_parsers.base import (
    PartialCall,
    json_value_end,
    locate_json_args,
    raw_json_call,
)
from pagedllm.structured_output.params import StructuredOutputsParams
from pagedllm.structured_output.strict_schema import close_objects


def tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolPlan:
    mode: str  # "none" | "auto" | "required" | "named"
    tools: list[dict]  # OpenAI tool definitions, for the chat template
    structured: StructuredOutputsParams | None = None
    parser: type[ToolParser] | None = None
    name: str | None = None  # the named tool
    max_calls: int | None = None  # parallel_tool_calls=false: 1

    @property
    def parses(self) -> bool:
        return self.mode in ("auto", "required", "named")

    def streamer(self) -> ToolCallStreamer:
        return ToolCallStreamer(self)

    def parse(self, text: str) -> ParseResult:
        s = self.streamer()
        out = s.feed(text)
        out.extend(s.finish())
        return out


def plan_tools(req: ChatCompletionRequest, options: ChatOptions) -> ToolPlan:
    """Validate tools / tool_choice (400s) and decide how this request is decoded and parsed."""
    tools = req.tools or []
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if not tools:
        if choice != "none":
            raise APIError(400, "tool_choice needs tools", param="tool_choice")
        return ToolPlan("none", [])
    defs = [t.model_dump(exclude_none=True) for t in tools]
    names = [t.function.name for t in tools]
    if len(set(names)) != len(names):
        raise APIError(400, "tool function names must be unique", param="tools")
    constrained = choice == "required" or not isinstance(choice, str)
    if constrained and (
        req.structured_outputs is not None
        or req.guided_json is not None
        or (req.response_format is not None and req.response_format.type != "text")
    ):
        raise APIError(
            400,
            "tool_choice required or named cannot be combined with "
            "response_format / structured_outputs",
            param="tool_choice",
        )
    max_calls = None if req.parallel_tool_calls else 1
    if choice == "none":
        return ToolPlan("none", defs)
    if choice == "auto":
        if not (options.enable_auto_tool_choice and options.tool_call_parser):
            raise APIError(
                400,
                '"auto" tool choice requires --enable-auto-tool-choice and '
                "--tool-call-parser to be set",
                param="tool_choice",
            )
        parser = TOOL_PARSERS[options.tool_call_parser]
        return ToolPlan("auto", defs, parser=parser, max_calls=max_calls)

    def params_of(tool) -> dict:
        schema = _parameters(tool.function.parameters)
        return close_objects(schema) if options.disable_additional_properties else schema

    if choice == "required":
        items = [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [t.function.name]},
                    "parameters": params_of(t),
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
            for t in tools
        ]
        schema = {
            "type": "array",
            "minItems": 1,
            "items": items[0] if len(items) == 1 else {"anyOf": items},
        }
        if max_calls is not None:
            schema["maxItems"] = max_calls
        return ToolPlan("required", defs, StructuredOutputsParams(json=schema))
    name = choice.function.name
    tool = next((t for t in tools if t.function.name == name), None)
    if tool is None:
        raise APIError(
            400,
            f"tool_choice names function {name!r}, which is not in tools ({', '.join(names)})",
            param="tool_choice",
        )
    return ToolPlan("named", defs, StructuredOutputsParams(json=params_of(tool)), name=name)


def strict_response_format(
    req: ChatCompletionRequest | CompletionRequest, options: ChatOptions
) -> StructuredOutputsParams | None:
    """A `strict: true` json_schema response format (chat, or completions' vLLM extension),
    compiled strictly (see the module docstring); None for anything else (the request's own
    constraint applies unchanged)."""
    rf = req.response_format
    if not options.disable_additional_properties or rf is None or rf.type != "json_schema":
        return None
    if rf.json_schema is None or not rf.json_schema.strict:
        return None
    params = structured_outputs_of(req)  # the 400s for a malformed format
    if params is None or params.json is None:
        return None
    return StructuredOutputsParams(
        json=close_objects(params.json), whitespace_pattern=params.whitespace_pattern
    )


def _parameters(schema: dict | None) -> dict:
    return schema if schema else {"type": "object", "properties": {}}


def to_tool_calls(calls: list[ParsedToolCall]) -> list[ToolCall]:
    return [
        ToolCall(id=tool_call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
        for c in calls
    ]


class ToolCallStreamer:
    """One choice's text -> (content, complete calls), delta by delta (see ToolParser)."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.parser = plan.parser(plan.tools) if plan.parser is not None else None
        self._buf = ""
        self._emitted = 0  # calls of a required-choice array emitted so far
        self._partial: PartialCall | None = None  # its open element
        self.num_calls = 0

    def feed(self, delta: str) -> ParseResult:
        mode = self.plan.mode
        if mode == "auto":
            out = self.parser.feed(delta)
        elif mode in ("required", "named"):
            self._buf += delta
            out = self._array_calls(final=False) if mode == "required" else ParseResult()
        else:
            out = ParseResult(content=delta)
        return self._count(out)

    def finish(self) -> ParseResult:
        mode = self.plan.mode
        if mode == "auto":
            out = self.parser.finish()
        elif mode == "required":
            out = self._array_calls(final=True)
        elif mode == "named":
            out = ParseResult(calls=[ParsedToolCall(self.plan.name, self._buf)])
        else:
            out = ParseResult()
        return self._count(out)

    def partial(self) -> PartialCall | None:
        """The call being written (see ToolParser.partial): the parser's under `auto`, the open
        array element's under `required`; None otherwise."""
        if self.plan.mode == "required":
            return self._partial
        return self.parser.partial() if self.parser is not None else None

    def _count(self, out: ParseResult) -> ParseResult:
        """Count the calls emitted; past `max_calls` they are dropped."""
        limit = self.plan.max_calls
        if limit is not None:
            del out.calls[max(0, limit - self.num_calls) :]
        self.num_calls += len(out.calls)
        return out

    def _array_calls(self, final: bool) -> ParseResult:
        """Complete elements of the `[{"name", "parameters"}, ...]` text not yet emitted (their
        parameters as written, so that what `partial` streamed adds up to them)."""
        out = ParseResult()
        self._partial = None
        decoder, text = json.JSONDecoder(), self._buf
        pos = text.find("[") + 1
        if pos == 0:
            return out
        index = 0
        while True:
            while pos < len(text) and text[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(text) or text[pos] == "]":
                break
            start = pos
            try:
                obj, pos = decoder.raw_decode(text, pos)
            except ValueError:
                found = None if final else locate_json_args(text, start)
                if found is not None:
                    name, at = found
                    self._partial = PartialCall(name, text[at : json_value_end(text, at)])
                break
            if index >= self._emitted:
                params = json.dumps(obj.get("parameters", {}), ensure_ascii=False)
                call = raw_json_call(text, start) or ParsedToolCall(obj.get("name", ""), params)
                out.calls.append(call)
                self._emitted += 1
            index += 1
        return out
