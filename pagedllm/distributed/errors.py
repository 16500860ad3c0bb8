"""Errors of the distributed layer (`EngineFatalError`, its base, is in pagedllm/errors.py:
the engine catches it without importing this layer)."""

from __future__ import annotations

from pagedllm.errors import EngineFatalError


class WorkerDied(EngineFatalError):
    """A tensor-parallel worker process (or Ray actor) died or stopped answering."""
