"""Typed errors raised by the model loader.

`ModelNotFoundError` (no checkpoint at the path, Hub id or default model) is the one "model
not found" of pagedllm and lives in pagedllm/errors.py, since the server raises it too; this
module holds the loader's own. Both are `ValueError`s (via `InvalidInputError`) so callers
that validate user input (CLI, server start-up) catch one type and show the message as is.
"""

from __future__ import annotations

from pagedllm.errors import ModelLoadError


class UnsupportedModelError(ModelLoadError):
    """The model exists but its format or architecture is not supported."""
