"""Tool-call parsers by `--tool-call-parser` name (the registry: base.TOOL_PARSERS).

Every module in this package is imported here, and each registers its parser with
`@register_tool_parser`: a new format is one file (see base.py for the contract).
"""

import importlib
import pkgutil

from pagedllm.entrypoints.tool_parsers.base import (
    TOOL_PARSERS,
    ParsedToolCall,
    ParseResult,
    ToolParser,
    register_tool_parser,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["TOOL_PARSERS", "ParseResult", "ParsedToolCall", "ToolParser", "register_tool_parser"]
