"""The tensor-parallel collectives a layer completes its output with, fixed at construction.

Model code declares what each layer needs: `Linear(..., combine="sum")` on a row-parallel
layer (o_proj, down_proj: each rank holds a partial sum), `combine="vocab"` on a
vocab-parallel lm_head (each rank holds a slice of the logits); `VocabEmbedding` holds a
slice of the table's rows; a MoE layer holds the experts `local_experts` names (all, or this
rank's under expert parallelism) and all-reduces its output. While a rank's model is
constructed its collectives are active (`tensor_parallel_layers(ops)`, entered by
worker/model_setup.build_model); each layer takes the one it needs then and keeps it. Outside that context (one rank) layers get None and run
alone. distributed/sharding.py implements `TensorParallelOps`; model code imports nothing of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Literal, Protocol

import torch

Combine = Literal["sum", "vocab"]


class TensorParallelOps(Protocol):
    """One rank's collectives over its tensor-parallel group."""

    def all_reduce(self, out: torch.Tensor) -> torch.Tensor:
        """Sum a row-parallel layer's partial outputs over the ranks."""

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [.., V/N] on each rank -> [.., V] on every rank."""

    def embed(self, lookup: Callable[[torch.Tensor], torch.Tensor], ids: torch.Tensor,
              rows: int) -> torch.Tensor:
        """Look `ids` up in this rank's `rows` rows of the table; zeros elsewhere, summed."""

    def local_experts(self, num_experts: int) -> tuple[int, int]:
        """[first, end) of a MoE layer's experts held on this rank (all but under expert
        parallelism)."""


_ACTIVE: ContextVar[TensorParallelOps | None] = ContextVar("tensor_parallel_ops", default=None)


@contextmanager
def tensor_parallel_layers(ops: TensorParallelOps | None) -> Iterator[None]:
    """Layers constructed inside take their collectives from `ops` (None: one rank)."""
    token = _ACTIVE.set(ops)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def output_collective(combine: Combine | None) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """What completes a linear layer's output on this rank (None: nothing to do)."""
    ops = _ACTIVE.get()
    if ops is None or combine is None:
        return None
    if combine == "sum":
        return ops.all_reduce
    if combine == "vocab":
        return ops.gather_vocab
    raise ValueError(f"combine must be 'sum', 'vocab' or None, got {combine!r}")


def local_experts(num_experts: int) -> tuple[int, int]:
    """[first, end) of the `num_experts` experts a MoE layer constructed now holds."""
    ops = _ACTIVE.get()
    return (0, num_experts) if ops is None else ops.local_experts(num_experts)


def embedding_collective() -> TensorParallelOps | None:
    """The collectives a vocab-parallel embedding looks up through (None: one rank)."""
    return _ACTIVE.get()
