"""Package attributes imported on first use (PEP 562 module `__getattr__`): `import pagedllm`
and `pagedllm --help` do not import torch until a name that needs it is used."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_getattr(package: str, exports: dict[str, str], namespace: dict) -> Callable:
    """The `__getattr__` of `package`: `exports[name]` is the module that defines `name`; the
    first lookup imports it and stores the value in `namespace` (the package's globals), so
    later lookups are plain attribute reads."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value
        return value

    return __getattr__
