"""Streamed tool-call entries of one choice (OpenAI's shape: one entry per call index per
chunk; the first entry of an index carries its id, type and name).

A call the parser reports open (`ToolParser.partial`: its name and arguments so far) is
opened at once and its arguments follow as they grow; when it completes, the rest of its
arguments goes out. A call that completes within one step goes out whole in one entry.

    step   parser                                 entries
    1      partial("f", '{"a": ')                 {index 0, id, type, name "f", args '{"a": '}
    2      partial("f", '{"a": 1, "b')            {index 0, args '1, "b'}
    3      call f '{"a": 1, "b": 2}' + call g     {index 0, args '": 2}'}  {index 1, id, name "g", args ...}
"""

from __future__ import annotations

import logging

from pagedllm.entrypoints.protocol_responses import DeltaFunctionCall, DeltaToolCall
from pagedllm.entrypoints.tool_calls import tool_call_id
from pagedllm.entrypoints.tool_parsers import ParsedToolCall
from pagedllm.entrypoints.tool_parsers.base import PartialCall

logger = logging.getLogger(__name__)


class ToolCallDeltas:
    def __init__(self, max_calls: int | None = None) -> None:
        self.max_calls = max_calls
        self._open: int | None = None  # the index opened before it completed
        self._sent = ""  # its arguments sent so far

    def entries(
        self, first_index: int, calls: list[ParsedToolCall], partial: PartialCall | None
    ) -> list[DeltaToolCall]:
        """This step's entries: `calls` completed now (indexes from `first_index`), then the
        call still open, if any."""
        out = []
        for k, call in enumerate(calls):
            index = first_index + k
            if index == self._open:
                rest = call.arguments.removeprefix(self._sent)
                if len(rest) + len(self._sent) != len(call.arguments):
                    logger.warning("tool call %d: arguments differ from those streamed", index)
                if rest:
                    out.append(
                        DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=rest))
                    )
                self._open, self._sent = None, ""
            else:
                out.append(_opening(index, call.name, call.arguments))
        index = first_index + len(calls)
        if partial is None or (self.max_calls is not None and index >= self.max_calls):
            return out
        if self._open != index:
            out.append(_opening(index, partial.name, partial.arguments))
            self._open, self._sent = index, partial.arguments
        elif partial.arguments.startswith(self._sent) and len(partial.arguments) > len(self._sent):
            more = partial.arguments[len(self._sent) :]
            out.append(DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=more)))
            self._sent = partial.arguments
        return out


def _opening(index: int, name: str, arguments: str) -> DeltaToolCall:
    return DeltaToolCall(
        index=index,
        id=tool_call_id(),
        type="function",
        function=DeltaFunctionCall(name=name, arguments=arguments),
    )
