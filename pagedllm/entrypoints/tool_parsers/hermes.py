"""Hermes / Qwen style: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number.

Content is the text before the first call; text between and after calls is dropped (as vLLM).
A call ends at the first `</tool_call>` after which its JSON is complete (one inside a JSON
string does not end it); an unclosed call at the end is parsed if its JSON is complete, and
the text is returned as content otherwise (so nothing the model wrote is lost). Arguments
stream as they are written once `{"name": ..., "arguments": ` has arrived.
"""

from __future__ import annotations

import json

from pagedllm.entrypoints.tool_parsers.base import (
    ParsedToolCall,
    TaggedToolParser,
    call_from_json,
    locate_json_args,
    raw_json_call,
    register_tool_parser,
)


@register_tool_parser
class HermesToolParser(TaggedToolParser):
    name = "hermes"
    call_start, call_end = "<tool_call>", "</tool_call>"

    def locate_args(self, body: str) -> tuple[str, int] | None:
        return locate_json_args(body)

    def parse_call(self, body: str) -> ParsedToolCall | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        call = call_from_json(obj)
        if call is None:
            return None
        return raw_json_call(body) or call  # as written, when it was streamed so
