"""Hermes / Qwen style: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number.

Content is the text before the first call; text between and after calls is dropped (as vLLM).
An unclosed call at the end is parsed if its JSON is complete. A call whose JSON does not
parse turns the whole rest into content, so nothing the model wrote is lost.
"""

from __future__ import annotations

import json

from pagedllm.entrypoints.tool_parsers.base import (
    ParseResult,
    ToolParser,
    call_from_json,
    partial_suffix,
)

START, END = "<tool_call>", "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"

    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False
        self._seen_call = False
        self._failed = False  # a call did not parse: everything else is content

    def feed(self, delta: str) -> ParseResult:
        out = ParseResult()
        if self._failed:
            out.content = delta
            return out
        self._buf += delta
        while True:
            if not self._in_call:
                i = self._buf.find(START)
                if i < 0:
                    keep = partial_suffix(self._buf, START)
                    text, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
                    if not self._seen_call:
                        out.content += text
                    return out
                if not self._seen_call:
                    out.content += self._buf[:i]
                self._buf, self._in_call = self._buf[i + len(START):], True
            j = self._buf.find(END)
            if j < 0:
                return out
            body, self._buf, self._in_call = self._buf[:j], self._buf[j + len(END):], False
            if not self._take(body, out, closed=True):
                return out

    def finish(self) -> ParseResult:
        out = ParseResult()
        rest, self._buf = self._buf, ""
        if self._failed:
            out.content = rest
        elif self._in_call:
            self._in_call = False
            if rest.strip():
                self._take(rest, out, closed=False)
        elif not self._seen_call:
            out.content = rest
        return out

    def _take(self, body: str, out: ParseResult, closed: bool) -> bool:
        try:
            call = call_from_json(json.loads(body))
        except ValueError:
            call = None
        if call is None:
            self._failed = True
            out.content += START + body + (END if closed else "") + self._buf
            self._buf = ""
            return False
        self._seen_call = True
        out.calls.append(call)
        return True
