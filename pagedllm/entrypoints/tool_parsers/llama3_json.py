"""Llama 3.x JSON tool calls: the answer is `{"name": ..., "parameters": {...}}` (optionally
after `<|python_tag|>`, several separated by `;`). An answer that does not start like that is
content, streamed as it comes. One that does is read as it arrives: each call is emitted when
its object closes, its arguments streamed as written before that; if the text turns out not to
be calls, it is all returned as content at the end (unless calls already went out: then the
rest is dropped)."""

from __future__ import annotations

import json

from pagedllm.entrypoints.tool_parsers.base import (
    ParseResult,
    PartialCall,
    ToolParser,
    call_from_json,
    json_value_end,
    locate_json_args,
    raw_json_call,
    register_tool_parser,
)

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


@register_tool_parser
class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"

    def __init__(self, tools: list[dict] | None = None) -> None:
        super().__init__(tools)
        self._buf = ""
        self._mode: str | None = None  # None: undecided; "content" | "calls"
        self._pos = 0  # calls read up to here
        self._calls = 0
        self._failed = False
        self._partial: PartialCall | None = None

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
            self._pos = len(self._buf) - len(head.removeprefix(PYTHON_TAG))
        return ParseResult(calls=self._scan())

    def _scan(self) -> list:
        calls, text = [], self._buf
        self._partial = None
        while not self._failed:
            pos = self._pos
            while pos < len(text) and text[pos] in " \t\r\n;":
                pos += 1
            if pos == len(text):
                break
            try:
                obj, end = _DECODER.raw_decode(text, pos)
            except ValueError:
                found = locate_json_args(text, pos)
                if found is not None:
                    name, start = found
                    self._partial = PartialCall(name, text[start : json_value_end(text, start)])
                break
            call = (raw_json_call(text, pos) if locate_json_args(text, pos) else None) or (
                call_from_json(obj)
            )
            if call is None:
                self._failed = True
                break
            calls.append(call)
            self._pos = end
        self._calls += len(calls)
        return calls

    def partial(self) -> PartialCall | None:
        return self._partial

    def finish(self) -> ParseResult:
        text, self._buf, self._partial = self._buf, "", None
        if self._mode != "calls":
            return ParseResult(content=text)
        rest = text[self._pos :].strip(" \t\r\n;")
        if self._calls == 0 and (rest or self._failed):
            return ParseResult(content=text)  # not calls after all
        return ParseResult()
