"""Reasoning parsers (`--reasoning-parser NAME`): split a reasoning model's output into its
thinking (`reasoning_content`) and its answer (`content`), delta by delta.

The plug-in contract, as the tool parsers': a `ReasoningParser` subclass with a unique
`name`, its `start` / `end` markers, registered with `@register_reasoning_parser` (every
module of this package is imported by `__init__`, so a parser is one file). `for_request`
decides per request whether there is thinking to parse and whether the prompt already opened
it; `feed` / `finish` are a streaming state machine, run alike over the whole text, so
streamed deltas reassemble to the non-streamed answer:

    state      text                                   becomes
    MAYBE      a leading `start` (whitespace before)   -> THINKING; anything else: ANSWER
    THINKING   up to `end` (a leading `start` dropped)  reasoning; `end` -> ANSWER
    ANSWER     the rest                                 content

A partial marker at the end of a delta is held back until the next delta decides it.
"""

from __future__ import annotations

from dataclasses import dataclass

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {}
MAYBE, THINKING, ANSWER = "maybe", "thinking", "answer"


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""

    def extend(self, other: ReasoningDelta) -> None:
        self.reasoning += other.reasoning
        self.content += other.content


class ReasoningParser:
    name = ""
    start, end = "<think>", "</think>"
    # The output is inside the thinking from its first token even when the prompt does not
    # show it opening (vLLM's DeepSeek-R1 rule); otherwise only a prompt that opened it, or
    # a leading `start` in the output, starts the thinking.
    always_thinking = False
    special_tokens = False  # its markers are special tokens: the server keeps them in the text

    def __init__(self, in_thinking: bool) -> None:
        self.state = THINKING if in_thinking else MAYBE
        self._buf = ""
        self._fresh = True  # nothing of the thinking emitted yet (a leading start may come)

    @classmethod
    def for_request(cls, prompt_tail: str, template_kwargs: dict | None) -> ReasoningParser | None:
        """The parser for one choice, or None when this request has no thinking (e.g. Qwen3's
        `enable_thinking: false`). `prompt_tail`: the end of the rendered prompt."""
        return cls(cls.prompt_opens_thinking(prompt_tail) or cls.always_thinking)

    @classmethod
    def prompt_opens_thinking(cls, prompt_tail: str) -> bool:
        return prompt_tail.rfind(cls.start) > prompt_tail.rfind(cls.end)

    def feed(self, delta: str) -> ReasoningDelta:
        out = ReasoningDelta()
        self._buf += delta
        while self._buf:
            if self.state == ANSWER:
                out.content += self._buf
                self._buf = ""
            elif self.state == MAYBE:
                head = self._buf.lstrip()
                if not head or (self.start.startswith(head) and head != self.start):
                    break  # undecided
                if head.startswith(self.start):
                    self._buf, self.state = head[len(self.start) :], THINKING
                    self._fresh = False
                else:
                    self.state = ANSWER
            else:
                if self._fresh:  # a leading start in the output itself is not reasoning
                    head = self._buf.lstrip()
                    if not head or (self.start.startswith(head) and head != self.start):
                        break
                    self._fresh = False
                    if head.startswith(self.start):
                        self._buf = head[len(self.start) :]
                i = self._buf.find(self.end)
                if i < 0:
                    cut = len(self._buf) - _partial_suffix(self._buf, self.end)
                    out.reasoning += self._buf[:cut]
                    self._buf = self._buf[cut:]
                    break
                out.reasoning += self._buf[:i]
                self._buf, self.state = self._buf[i + len(self.end) :], ANSWER
        return out

    def finish(self) -> ReasoningDelta:
        """The held-back text: unterminated thinking stays reasoning (vLLM's rule)."""
        rest, self._buf = self._buf, ""
        if self.state == THINKING:
            return ReasoningDelta(reasoning=rest)
        return ReasoningDelta(content=rest)

    @classmethod
    def split(cls, text: str, in_thinking: bool) -> ReasoningDelta:
        """(reasoning, content) of a whole answer."""
        parser = cls(in_thinking)
        out = parser.feed(text)
        out.extend(parser.finish())
        return out


def register_reasoning_parser(cls: type[ReasoningParser]) -> type[ReasoningParser]:
    if not cls.name or cls.name in REASONING_PARSERS:
        raise ValueError(f"reasoning parser name {cls.name!r} is empty or taken")
    REASONING_PARSERS[cls.name] = cls
    return cls


def _partial_suffix(text: str, marker: str) -> int:
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
