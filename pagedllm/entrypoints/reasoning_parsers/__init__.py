"""Reasoning parsers by `--reasoning-parser` name (the registry: base.REASONING_PARSERS).

Every module in this package is imported here, and each registers its parser with
`@register_reasoning_parser`: a new model family is one file (see base.py).
"""

import importlib
import pkgutil

from pagedllm.entrypoints.reasoning_parsers.base import (
    REASONING_PARSERS,
    ReasoningDelta,
    ReasoningParser,
    register_reasoning_parser,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["REASONING_PARSERS", "ReasoningDelta", "ReasoningParser", "register_reasoning_parser"]
