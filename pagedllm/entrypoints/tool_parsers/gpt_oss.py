"""gpt-oss function calls (harmony format, see entrypoints/harmony.py): a message addressed
`to=functions.NAME` whose body is the JSON arguments, streamed as they come; the body ends at
`<|call|>` (a stop token, so usually the end of the text). Other messages' text is content
(`final`, preambles; `analysis` too when no reasoning parser took it); messages to built-in
tools (browser, python) are not function calls and stay content."""

from __future__ import annotations

from pagedllm.entrypoints.harmony import HarmonySplitter
from pagedllm.entrypoints.tool_parsers.base import (
    ParseResult,
    PartialCall,
    ToolParser,
    call_with_raw_args,
    register_tool_parser,
)

FUNCTIONS = "functions."


@register_tool_parser
class GptOssToolParser(ToolParser):
    name = "gpt_oss"
    special_tokens = True

    def __init__(self, tools: list[dict] | None = None) -> None:
        super().__init__(tools)
        self._splitter = HarmonySplitter()
        self._call: PartialCall | None = None  # the function call being written

    def feed(self, delta: str) -> ParseResult:
        return self._route(self._splitter.feed(delta))

    def finish(self) -> ParseResult:
        out = self._route(self._splitter.finish())
        self._call = None
        return out

    def partial(self) -> PartialCall | None:
        call = self._call
        return call if call is not None and call.arguments.lstrip().startswith("{") else None

    def _route(self, pieces) -> ParseResult:
        out = ParseResult()
        for p in pieces:
            if p.recipient is None or not p.recipient.startswith(FUNCTIONS):
                out.content += p.text
                continue
            name = p.recipient[len(FUNCTIONS) :]
            if self._call is None:
                self._call = PartialCall(name, "")
            self._call.arguments += p.text
            if p.done:
                call = call_with_raw_args(name, self._call.arguments)
                if call is None:  # not JSON arguments: what the model wrote stays visible
                    out.content += self._call.arguments
                else:
                    out.calls.append(call)
                self._call = None
        return out
