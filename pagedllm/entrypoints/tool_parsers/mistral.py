"""Mistral's calls, after the `[TOOL_CALLS]` special token, in either of its tokenizers' forms:

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {...}]    (v3 - v7)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}     (v11+)

(v13's `[CALL_ID]id` after the name is accepted and ignored: the server makes its own ids.)
Text before the first `[TOOL_CALLS]` is content; a call's arguments stream as they are written
and the call completes when its JSON closes.
`[TOOL_CALLS]` is a special token, so the server keeps special tokens in the text (as vLLM).
"""

from __future__ import annotations

import json

from pagedllm.entrypoints.tool_parsers.base import (
    ParseResult,
    PartialCall,
    ToolParser,
    call_from_json,
    call_with_raw_args,
    json_value_end,
    locate_json_args,
    partial_suffix,
    raw_json_call,
    register_tool_parser,
)

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_DECODER = json.JSONDecoder()


@register_tool_parser
class MistralToolParser(ToolParser):
    name = "mistral"
    special_tokens = True

    def __init__(self, tools: list[dict] | None = None) -> None:
        super().__init__(tools)
        self._buf = ""
        self._raw = ""  # everything from the first [TOOL_CALLS] on
        self._in_calls = False
        self._in_array = False
        self._seen_call = False
        self._failed = False
        self._partial: PartialCall | None = None

    def feed(self, delta: str) -> ParseResult:
        out = ParseResult()
        self._buf += delta
        if self._in_calls:
            self._raw += delta
        else:
            i = self._buf.find(TOOL_CALLS)
            if i < 0:
                cut = len(self._buf) - partial_suffix(self._buf, TOOL_CALLS)
                out.content, self._buf = self._buf[:cut], self._buf[cut:]
                return out
            out.content, self._raw = self._buf[:i], self._buf[i:]
            self._buf, self._in_calls = self._buf[i + len(TOOL_CALLS) :], True
        out.calls = self._calls()
        return out

    def _calls(self) -> list:
        """Complete calls at the head of the buffer (consumed); the rest waits (the open
        call's arguments so far are `partial()`)."""
        calls = []
        self._partial = None
        while not self._failed:
            text = self._buf.lstrip()
            if self._in_array:
                text = text.lstrip(", \n")
                if text.startswith("]"):
                    self._in_array, self._buf = False, text[1:]
                    continue
                found = locate_json_args(text)
                try:
                    obj, end = _DECODER.raw_decode(text)
                except ValueError:
                    if found is not None:
                        name, start = found
                        self._partial = PartialCall(name, text[start : json_value_end(text, start)])
                    return calls
                call = (raw_json_call(text) if found else None) or call_from_json(obj)
            elif TOOL_CALLS.startswith(text):  # nothing yet, or a marker arriving
                return calls
            elif text.startswith(TOOL_CALLS):
                self._buf = text[len(TOOL_CALLS) :]
                continue
            elif text.startswith("["):
                self._in_array, self._buf = True, text[1:]
                continue
            else:
                head, sep, rest = text.partition(ARGS)
                if not sep:
                    return calls
                name = head.split(CALL_ID, 1)[0].strip()
                start = len(text) - len(rest.lstrip())
                if start == len(text):
                    return calls
                end = json_value_end(text, start) if text[start] == "{" else -1
                if end is None:
                    if name:
                        self._partial = PartialCall(name, text[start:])
                    return calls
                call = call_with_raw_args(name, text[start:end]) if name and end > 0 else None
            if call is None:  # not a call after all: stop parsing, finish() decides
                self._failed = True
                return calls
            calls.append(call)
            self._seen_call = True
            self._buf = text[end:]
        return calls

    def partial(self) -> PartialCall | None:
        return self._partial

    def finish(self) -> ParseResult:
        out = ParseResult()
        self._partial = None
        if not self._in_calls:
            out.content, self._buf = self._buf, ""
        elif not self._seen_call:
            out.content = self._raw
        return out
