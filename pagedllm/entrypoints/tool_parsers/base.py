"""Tool-call parsers for `tool_choice="auto"`: find the calls a model wrote in its own format.

A parser is a streaming state machine (`feed` each text delta, then `finish`) that splits the
text into content (passed through as it arrives, up to the first call) and complete calls
(emitted when each one closes). The non-streamed answer runs the same machine over the whole
text, so streamed deltas always reassemble to the non-streamed result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # JSON text


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

    def feed(self, delta: str) -> ParseResult:
        raise NotImplementedError

    def finish(self) -> ParseResult:
        raise NotImplementedError

    @classmethod
    def parse(cls, text: str) -> ParseResult:
        """The whole answer at once: content and calls."""
        parser = cls()
        out = parser.feed(text)
        out.extend(parser.finish())
        return out


def call_from_json(obj: object) -> ParsedToolCall | None:
    """{"name": str, "arguments" | "parameters": object | JSON string} -> a call, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
