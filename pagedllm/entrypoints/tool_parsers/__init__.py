"""Tool-call parsers by `--tool-call-parser` name."""

from pagedllm.entrypoints.tool_parsers.base import ParsedToolCall, ParseResult, ToolParser
from pagedllm.entrypoints.tool_parsers.hermes import HermesToolParser
from pagedllm.entrypoints.tool_parsers.llama3_json import Llama3JsonToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesToolParser, Llama3JsonToolParser)}

__all__ = ["TOOL_PARSERS", "ParseResult", "ParsedToolCall", "ToolParser"]
