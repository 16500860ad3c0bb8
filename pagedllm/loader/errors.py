"""Typed errors raised by the model loader.

Both derive from ``ValueError`` so callers that validate user input (CLI, server
startup) can catch one exception type and show the message as is.
"""

from __future__ import annotations


class ModelNotFoundError(ValueError):
    """The requested model could not be located on disk."""


class UnsupportedModelError(ValueError):
    """The model exists but its format or architecture is not supported."""
