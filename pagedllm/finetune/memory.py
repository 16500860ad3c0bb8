"""Measuring what a training step holds for backward.

On CUDA, `torch.cuda.max_memory_allocated` is the peak. On CPU torch exposes no allocator
peak, so `SavedActivationMeter` counts the bytes autograd saves for backward during a
forward (unique storages, via `saved_tensors_hooks`): the activation memory that gradient
checkpointing trades for recomputation. The benchmark also reports each run's peak RSS.
"""

from __future__ import annotations

import torch


class SavedActivationMeter:
    """`with SavedActivationMeter() as m: loss = forward()` -> `m.bytes` held for backward
    (frozen parameters, which are kept anyway, excluded)."""

    def __init__(self, exclude: list[torch.Tensor] | None = None) -> None:
        self._exclude = {t.untyped_storage().data_ptr() for t in exclude or []}
        self._seen: set[int] = set()
        self.bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self._seen and ptr not in self._exclude:
            self._seen.add(ptr)
            self.bytes += storage.nbytes()
        return t

    def __enter__(self) -> SavedActivationMeter:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
