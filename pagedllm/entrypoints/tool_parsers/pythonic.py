"""Pythonic calls (Llama 3.2 and Llama 4's format): the answer is a Python list of calls with
literal keyword arguments, optionally inside Llama 4's `<|python_start|>` ... `<|python_end|>`:

    [get_weather(city="Paris", unit="celsius"), get_time(zone="UTC+1")]

An answer that does not start with `[` (or the start tag) is content, streamed as it comes.
One that does is scanned as it arrives: each call is emitted once its closing parenthesis
(outside strings) arrives and it reads as `name(key=literal, ...)`; before that its arguments
stream keyword by keyword (`partial`). If the text turns out not to be a list of calls, the
whole answer is returned as content at the end (vLLM's rule).
"""

from __future__ import annotations

import ast
import json

from pagedllm.entrypoints.tool_parsers.base import (
    ParsedToolCall,
    ParseResult,
    PartialCall,
    ToolParser,
    register_tool_parser,
)

START, END = "<|python_start|>", "<|python_end|>"
_OPEN, _CLOSE = "([{", ")]}"


@register_tool_parser
class PythonicToolParser(ToolParser):
    name = "pythonic"

    def __init__(self, tools: list[dict] | None = None) -> None:
        super().__init__(tools)
        self._buf = ""
        self._mode: str | None = None  # None: undecided; "content" | "calls"
        self._pos = 0  # scanned up to here
        self._depth = 0  # bracket depth inside the outer list
        self._quote = ""  # the open string's quote, "" outside strings
        self._escape = False
        self._call_at: int | None = None  # where the call being scanned starts
        self._args_end: int | None = None  # its keyword arguments are complete up to here
        self._calls = 0
        self._failed = False

    def feed(self, delta: str) -> ParseResult:
        if self._mode == "content":
            return ParseResult(content=delta)
        self._buf += delta
        if self._mode is None:
            head = self._buf.lstrip()
            body = head.removeprefix(START).lstrip()
            if START.startswith(head) or (head.startswith(START) and not body):
                return ParseResult()  # nothing yet, or only the tag
            if not body.startswith("["):
                self._mode = "content"
                text, self._buf = self._buf, ""
                return ParseResult(content=text)
            self._mode = "calls"
            self._pos = len(self._buf) - len(body) + 1  # past the outer "["
        return ParseResult(calls=self._scan())

    def _scan(self) -> list[ParsedToolCall]:
        calls = []
        text = self._buf
        while self._pos < len(text) and not self._failed:
            ch = text[self._pos]
            self._pos += 1
            if self._quote:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == self._quote:
                    self._quote = ""
            elif ch in "\"'":
                self._quote = ch
            elif ch in _OPEN:
                self._depth += 1
                if self._depth == 1 and ch == "(" and self._call_at is not None:
                    self._args_end = self._pos  # the call's name is known
            elif ch in _CLOSE:
                self._depth -= 1
                if self._depth == 0 and ch == ")" and self._call_at is not None:
                    call = _call(text[self._call_at : self._pos])
                    if call is None:
                        self._failed = True
                        break
                    calls.append(call)
                    self._call_at = self._args_end = None
            elif ch == "," and self._depth == 1 and self._args_end is not None:
                self._args_end = self._pos - 1  # keyword arguments complete up to here
            elif self._depth == 0 and self._call_at is None and not (ch.isspace() or ch == ","):
                self._call_at = self._pos - 1
        self._calls += len(calls)
        return calls

    def partial(self) -> PartialCall | None:
        """The open call's name and its complete keyword arguments, as the head of the JSON
        the whole call will carry."""
        if self._call_at is None or self._args_end is None or self._failed:
            return None
        call = _call(self._buf[self._call_at : self._args_end] + ")")
        return None if call is None else PartialCall(call.name, call.arguments[:-1])

    def finish(self) -> ParseResult:
        text, self._buf = self._buf, ""
        if self._mode != "calls":
            return ParseResult(content=text)
        body = text.strip().removeprefix(START).removesuffix(END).strip()
        whole = _call_list(body)
        if whole is None:  # not a list of calls after all: content, unless calls went out
            return ParseResult(content="" if self._calls else text)
        return ParseResult(calls=whole[self._calls :])


def _call(text: str) -> ParsedToolCall | None:
    """`name(key=literal, ...)` -> a call (arguments as JSON), else None."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = ast.unparse(node.func)  # a dotted name is allowed (module.fn)
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
        if len(args) != len(node.keywords):
            return None
        return ParsedToolCall(name, json.dumps(args, ensure_ascii=False))
    except (SyntaxError, ValueError, TypeError):
        return None


def _call_list(body: str) -> list[ParsedToolCall] | None:
    try:
        node = ast.parse(body, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.List):
        return None
    calls = [_call(ast.unparse(e)) for e in node.elts]
    return None if any(c is None for c in calls) else calls
