"""Tool-call parsers for `tool_choice="auto"`: find the calls a model wrote in its own format.

The plug-in contract: a subclass of `ToolParser` with a unique `name` (the `--tool-call-parser`
value), constructed once per choice with the request's tool definitions, that implements
`feed` (each text delta) and `finish` (end of the text). It splits the text into content
(passed through as it arrives, up to the first call) and complete calls (emitted as each one
closes); `partial` reports the call still being written (its name and arguments so far, a
prefix of its final arguments), so streams send arguments as they come. The non-streamed answer runs the same machine over the whole text, so streamed deltas
always reassemble to the non-streamed result. Registering is the `@register_tool_parser`
decorator; every module of this package is imported by `__init__`, so a new parser is one file.

`TaggedToolParser` does the streaming for formats that wrap each call in start / end markers
(a subclass gives the markers and `parse_call(body)`); `special_tokens = True` marks formats
whose markers are special tokens (the server then keeps special tokens in the text).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_PARSERS: dict[str, type[ToolParser]] = {}


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # JSON text


@dataclass
class PartialCall:
    """The call being written: its name, and its arguments so far (a prefix of the
    `arguments` its complete ParsedToolCall will carry, so streamed pieces add up)."""

    name: str
    arguments: str


@dataclass
class ParseResult:
    content: str = ""
    calls: list[ParsedToolCall] = field(default_factory=list)

    def extend(self, other: ParseResult) -> None:
        self.content += other.content
        self.calls.extend(other.calls)


class ToolParser:
    """Base: subclasses implement `feed` and `finish` (see the module docstring)."""

    name = ""
    special_tokens = False  # its markers are special tokens: keep them in the text

    def __init__(self, tools: list[dict] | None = None) -> None:
        self.tools = tools or []  # OpenAI tool definitions of the request

    def feed(self, delta: str) -> ParseResult:
        raise NotImplementedError

    def finish(self) -> ParseResult:
        raise NotImplementedError

    def partial(self) -> PartialCall | None:
        """The open call once its name is known (streams send its arguments as they come);
        None: no call open, or this format's arguments are only known whole."""
        return None

    @classmethod
    def parse(cls, text: str, tools: list[dict] | None = None) -> ParseResult:
        """The whole answer at once: content and calls."""
        parser = cls(tools)
        out = parser.feed(text)
        out.extend(parser.finish())
        return out

    def parameters_of(self, name: str) -> dict[str, Any]:
        """The `properties` of tool `name`'s parameter schema ({} if unknown)."""
        for t in self.tools:
            fn = t.get("function", {})
            if fn.get("name") == name:
                return (fn.get("parameters") or {}).get("properties") or {}
        return {}


def register_tool_parser(cls: type[ToolParser]) -> type[ToolParser]:
    """Class decorator: make `cls` the parser of `--tool-call-parser cls.name`."""
    if not cls.name or cls.name in TOOL_PARSERS:
        raise ValueError(f"tool parser name {cls.name!r} is empty or taken")
    TOOL_PARSERS[cls.name] = cls
    return cls


class TaggedToolParser(ToolParser):
    """Calls wrapped in markers: content until `calls_start` (or the first `call_start`),
    then each `call_start ... call_end` body is handed to `parse_call`; text between calls
    is dropped (as vLLM). A body that `parse_call` refuses is waited on (its end marker may
    have been inside a string); an unclosed call at the end is parsed if it parses, and
    returned as content otherwise, so nothing the model wrote is lost."""

    calls_start = ""  # "" : the first call_start
    call_start = ""
    call_end = ""

    def __init__(self, tools: list[dict] | None = None) -> None:
        super().__init__(tools)
        self._buf = ""
        self._in_calls = False  # past calls_start
        self._raw = ""  # the text from the opener on (content, if no call parses)
        self._in_call = False  # inside call_start ... (call_end)
        self._seen_call = False

    def parse_call(self, body: str) -> ParsedToolCall | None:
        """A whole call body -> the call (its raw JSON arguments where `locate_args` finds
        them, so that they extend what `partial` streamed), else None."""
        raise NotImplementedError

    def locate_args(self, body: str) -> tuple[str, int] | None:
        """(name, where the arguments' JSON object starts) in a call body written so far, for
        formats that stream arguments; None: not known (yet)."""
        return None

    def partial(self) -> PartialCall | None:
        if not self._in_call:
            return None
        found = self.locate_args(self._buf)
        if found is None:
            return None
        name, start = found
        end = json_value_end(self._buf, start)
        return PartialCall(name, self._buf[start:end])

    def feed(self, delta: str) -> ParseResult:
        out = ParseResult()
        self._buf += delta
        if self._in_calls:
            self._raw += delta
        else:
            opener = self.calls_start or self.call_start
            i = self._buf.find(opener)
            if i < 0:
                cut = len(self._buf) - partial_suffix(self._buf, opener)
                out.content, self._buf = self._buf[:cut], self._buf[cut:]
                return out
            out.content, self._buf = self._buf[:i], self._buf[i:]
            self._raw, self._in_calls = self._buf, True
            self._buf = self._buf[len(self.calls_start) :]
        while True:
            if not self._in_call:
                i = self._buf.find(self.call_start)
                if i < 0:  # keep what may be the start of a marker
                    keep = partial_suffix(self._buf, self.call_start)
                    self._buf = self._buf[len(self._buf) - keep :] if keep else ""
                    return out
                self._buf, self._in_call = self._buf[i + len(self.call_start) :], True
            j = self._buf.find(self.call_end)
            while j >= 0 and self.parse_call(self._buf[:j]) is None:
                j = self._buf.find(self.call_end, j + 1)
            if j < 0:
                return out
            out.calls.append(self.parse_call(self._buf[:j]))
            self._seen_call = True
            self._buf, self._in_call = self._buf[j + len(self.call_end) :], False

    def finish(self) -> ParseResult:
        out = ParseResult()
        rest, self._buf = self._buf, ""
        if not self._in_calls:
            out.content = rest
            return out
        if self._in_call:  # unclosed at the end: a call if it parses
            call = self.parse_call(rest)
            if call is not None:
                out.calls.append(call)
                self._seen_call = True
        if not self._seen_call:  # markers but no call: the text is content after all
            out.content = self._raw
        return out


def call_from_json(obj: object) -> ParsedToolCall | None:
    """{"name": str, "arguments" | "parameters": object | JSON string} -> a call, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return call_with_args(obj["name"], args)


def call_with_args(name: str, args: object) -> ParsedToolCall | None:
    """A call from a name and its arguments (an object, or its JSON text), else None."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedToolCall(name, json.dumps(args, ensure_ascii=False))


_NAME_FIRST = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)'
)


def locate_json_args(text: str, pos: int = 0) -> tuple[str, int] | None:
    """`{"name": "f", "arguments": {` (or "parameters") at `pos` -> ("f", where the arguments
    object starts); None if the text does not (yet) read so."""
    m = _NAME_FIRST.match(text, pos)
    if m is None:
        return None
    return json.loads(f'"{m.group(1)}"'), m.end()


def raw_json_call(text: str, pos: int = 0) -> ParsedToolCall | None:
    """A whole `{"name": ..., "arguments": {...}, ...}` object at `pos` with its arguments
    kept as written (what `locate_json_args` streamed), else None."""
    found = locate_json_args(text, pos)
    if found is None:
        return None
    name, start = found
    end = json_value_end(text, start)
    if end is None:
        return None
    return call_with_raw_args(name, text[start:end])


def call_with_raw_args(name: str, raw: str) -> ParsedToolCall | None:
    """A call whose arguments are `raw` as written, if `raw` is one JSON object."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return ParsedToolCall(name, raw) if isinstance(value, dict) else None


def json_value_end(text: str, start: int) -> int | None:
    """End (exclusive) of the JSON object or array opening at `text[start]`, None while it is
    not closed; strings (and their escapes) are skipped."""
    depth, quote, escape = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                quote = False
        elif ch == '"':
            quote = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
