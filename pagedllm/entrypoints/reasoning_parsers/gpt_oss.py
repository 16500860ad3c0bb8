"""gpt-oss (harmony format, see entrypoints/harmony.py): the `analysis` channel is the
reasoning; the `final` channel (and commentary addressed to no one, a preamble) is the content.
A message addressed to a function (`to=functions.NAME`) is passed on to the content in harmony
form, for `--tool-call-parser gpt_oss`; one to a built-in tool is content. The markers are special tokens, so the server keeps
special tokens in the text; thinking_token_budget and constrained output after the thinking
are refused (the analysis marker is not one token)."""

from __future__ import annotations

from pagedllm.entrypoints.harmony import CHANNEL, MESSAGE, HarmonySplitter, Piece
from pagedllm.entrypoints.reasoning_parsers.base import (
    ReasoningDelta,
    ReasoningParser,
    register_reasoning_parser,
)


@register_reasoning_parser
class GptOssReasoningParser(ReasoningParser):
    name = "gpt_oss"
    start, end = f"{CHANNEL}analysis{MESSAGE}", "<|end|>"
    special_tokens = True

    def __init__(self, in_thinking: bool) -> None:
        super().__init__(in_thinking)
        self._splitter = HarmonySplitter()
        self._call_open = False  # a function call's header went to the content

    @classmethod
    def for_request(cls, prompt_tail: str, template_kwargs: dict | None) -> ReasoningParser:
        return cls(False)  # the output opens its channels itself

    def feed(self, delta: str) -> ReasoningDelta:
        return self._route(self._splitter.feed(delta))

    def finish(self) -> ReasoningDelta:
        return self._route(self._splitter.finish())

    def _route(self, pieces: list[Piece]) -> ReasoningDelta:
        out = ReasoningDelta()
        for p in pieces:
            if p.recipient is not None and p.recipient.startswith("functions."):
                if not self._call_open:
                    out.content += f"{CHANNEL}commentary to={p.recipient}{MESSAGE}"
                    self._call_open = True
                out.content += p.text
                if p.done:
                    out.content += "<|call|>"
                    self._call_open = False
            elif p.channel == "analysis":
                out.reasoning += p.text
            else:
                out.content += p.text
        return out
