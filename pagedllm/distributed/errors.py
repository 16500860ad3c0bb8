"""Errors of the distributed layer."""

from __future__ import annotations


class EngineFatalError(RuntimeError):
    """The engine cannot go on (a worker or replica it needs is gone): the server fails every
    request in flight, answers /health with 503 and exits non-zero."""


class WorkerDied(EngineFatalError):
    """A tensor-parallel worker process (or Ray actor) died or stopped answering."""
