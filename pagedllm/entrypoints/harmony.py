"""OpenAI's harmony format (gpt-oss), read as the text streams in (special tokens kept):

    <|channel|>analysis<|message|>User asks about Paris.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
    {"city": "Paris"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

A message is a header (`<|start|>` role, `<|channel|>` name, an optional recipient
`to=functions.NAME` in the role or channel part, `<|constrain|>` type) up to `<|message|>`,
then a body up to `<|end|>`, `<|call|>` or `<|return|>` (the last two stop generation, so the
text usually just ends). `HarmonySplitter.feed` returns the body text of each message as it
arrives, tagged with its channel and recipient (text outside any message: a piece with
neither); a partial marker is held back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MESSAGE, CHANNEL = "<|message|>", "<|channel|>"
HEADER_STARTS = ("<|start|>", CHANNEL)
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")


@dataclass
class Piece:
    channel: str  # analysis | commentary | final | "" (a header without one)
    recipient: str | None  # e.g. "functions.get_weather"
    text: str  # body text
    done: bool  # the message's body ended here


class HarmonySplitter:
    def __init__(self) -> None:
        self._buf = ""
        self._header: tuple[str, str | None] | None = None  # in a body: (channel, recipient)
        self._in_header = False  # between a header's start and its <|message|>

    def feed(self, delta: str) -> list[Piece]:
        self._buf += delta
        pieces: list[Piece] = []
        while True:
            if self._header is None:
                if not self._in_header:  # text outside any message is plain text
                    starts = [k for m in HEADER_STARTS if (k := self._buf.find(m)) >= 0]
                    k = min(starts) if starts else -1
                    if k < 0:
                        k = len(self._buf) - max(_partial(self._buf, m) for m in HEADER_STARTS)
                    if k:
                        pieces.append(Piece("", None, self._buf[:k], False))
                        self._buf = self._buf[k:]
                    if not starts:
                        return pieces
                    self._in_header = True
                i = self._buf.find(MESSAGE)
                if i < 0:
                    return pieces
                self._in_header = False
                header, self._buf = self._buf[:i], self._buf[i + len(MESSAGE) :]
                channel = _CHANNEL.search(header)
                recipient = _RECIPIENT.search(header)
                self._header = (
                    channel.group(1) if channel else "",
                    recipient.group(1) if recipient else None,
                )
            ends = [(j, m) for m in ENDS if (j := self._buf.find(m)) >= 0]
            if not ends:
                keep = max(_partial(self._buf, m) for m in ENDS)
                cut = len(self._buf) - keep
                if cut:
                    pieces.append(Piece(*self._header, self._buf[:cut], False))
                    self._buf = self._buf[cut:]
                return pieces
            j, marker = min(ends)
            pieces.append(Piece(*self._header, self._buf[:j], True))
            self._buf, self._header = self._buf[j + len(marker) :], None

    def finish(self) -> list[Piece]:
        """The end of the text ends the open message (`<|call|>` / `<|return|>` are stop
        tokens); a header that never reached `<|message|>` is returned as a channel-less piece."""
        rest, self._buf, self._in_header = self._buf, "", False
        if self._header is not None:
            piece = Piece(*self._header, rest, True)
            self._header = None
            return [piece]
        return [Piece("", None, rest, True)] if rest.strip() else []


def _partial(text: str, marker: str) -> int:
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
