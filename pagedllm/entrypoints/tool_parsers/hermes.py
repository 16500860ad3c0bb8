"""Hermes / Qwen style: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number.

Content is the text before the first call; text between and after calls is dropped (as vLLM).
A call ends at the first `</tool_call>` after which its JSON is complete; an unclosed call
at the end is parsed if its JSON is complete, and returned as content otherwise (so nothing the
model wrote is lost).
"""

from __future__ import annotations

import json

from pagedllm.entrypoints.tool_parsers.base import (
    ParsedToolCall,
    ParseResult,
    ToolParser,
    call_from_json,
    partial_suffix,
    register_tool_parser,
)

START, END = "<tool_call>", "</tool_call>"


@register_tool_parser
class HermesToolParser(ToolParser):
    name = "hermes"

    def __init__(self, tools: list[dict] | None = None) -> None:
        super().__init__(tools)
        self._buf = ""
        self._in_call = False
        self._seen_call = False

    def feed(self, delta: str) -> ParseResult:
        out = ParseResult()
        self._buf += delta
        while True:
            if not self._in_call:
                i = self._buf.find(START)
                if i < 0:
                    cut = len(self._buf) - partial_suffix(self._buf, START)
                    text, self._buf = self._buf[:cut], self._buf[cut:]
                    if not self._seen_call:
                        out.content += text
                    return out
                if not self._seen_call:
                    out.content += self._buf[:i]
                self._buf, self._in_call = self._buf[i + len(START) :], True
            # The first END after which the body is a complete call ends it (an END inside a
            # JSON string does not); none yet: wait for more text.
            j = self._buf.find(END)
            while j >= 0 and _call(self._buf[:j]) is None:
                j = self._buf.find(END, j + 1)
            if j < 0:
                return out
            out.calls.append(_call(self._buf[:j]))
            self._seen_call = True
            self._buf, self._in_call = self._buf[j + len(END) :], False

    def finish(self) -> ParseResult:
        out = ParseResult()
        rest, self._buf = self._buf, ""
        if self._in_call:  # unclosed at the end: a call if its JSON is complete
            self._in_call = False
            call = _call(rest)
            if call is not None:
                out.calls.append(call)
            else:
                out.content = START + rest
        elif not self._seen_call:
            out.content = rest
        return out


def _call(body: str) -> ParsedToolCall | None:
    try:
        return call_from_json(json.loads(body))
    except ValueError:
        return None
