"""Llama 3.x JSON tool calls: the answer is `{"name": ..., "parameters": {...}}` (optionally
after `<|python_tag|>`, several separated by `;`). An answer that does not start like that is
content, streamed as it comes; one that does is held back and parsed at the end (a failed
parse returns it as content)."""

from __future__ import annotations

import json

from pagedllm.entrypoints.tool_parsers.base import (
    ParseResult,
    ToolParser,
    call_from_json,
    register_tool_parser,
)

PYTHON_TAG = "<|python_tag|>"


@register_tool_parser
class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def __init__(self, tools: list[dict] | None = None) -> None:
        super().__init__(tools)
        self._buf = ""
        self._mode: str | None = None  # None: undecided; "content" | "calls"

    def feed(self, delta: str) -> ParseResult:
        if self._mode == "content":
            return ParseResult(content=delta)
        self._buf += delta
        if self._mode is None:
            head = self._buf.lstrip()
            if not head or PYTHON_TAG.startswith(head):
                return ParseResult()
            self._mode = "calls" if head.startswith(("{", PYTHON_TAG)) else "content"
            if self._mode == "content":
                text, self._buf = self._buf, ""
                return ParseResult(content=text)
        return ParseResult()

    def finish(self) -> ParseResult:
        text, self._buf = self._buf, ""
        if self._mode != "calls":
            return ParseResult(content=text)
        body = text.lstrip().removeprefix(PYTHON_TAG)
        calls, decoder, pos = [], json.JSONDecoder(), 0
        try:
            while True:
                while pos < len(body) and body[pos] in " \t\r\n;":
                    pos += 1
                if pos == len(body):
                    break
                obj, pos = decoder.raw_decode(body, pos)
                call = call_from_json(obj)
                if call is None:
                    raise ValueError("not a tool call")
                calls.append(call)
        except ValueError:
            return ParseResult(content=text)
        return ParseResult(calls=calls) if calls else ParseResult(content=text)
