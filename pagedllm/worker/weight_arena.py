"""The model's weights in one anonymous mapping on transparent huge pages (CPU).

A decode step streams every weight once (SmolLM2 in Q4_1: 89 MB a token). Loaded tensor by
tensor, they lie in ~0.2-1 MiB allocations on 4 KiB pages: a step touches ~22,000 pages, and
each new page costs a TLB walk and restarts the hardware prefetcher, which stops at page
boundaries. Copied once after loading into one mapping advised MADV_HUGEPAGE (2 MiB pages
where the kernel allows them: THP "always" or "madvise"), a one-stream step went from 4.2-4.5
to 3.9 ms (Zen 4, 2 threads, default flags; the layers' GEMVs from 26-31 to ~36 GB/s, the
machine's read bandwidth), see docs/benchmarks.md.

What moves: every parameter and buffer (torch's API; a Parameter keeps its identity, only its
`.data` moves) and the tensors each layer's weight holders keep outside them (`relocate`:
a `LinearMethod`'s packed panels, quantized codes and scales, bf16 copies; MoE experts'
quantized weights and grouped stacks). Tensors that share storage (a tied lm_head, views of
one buffer) keep sharing it: storage is copied once and every tensor over it becomes the
same view of the copy (only the bytes the weights read: a GGUF file's tensors, not its
metadata).
Old storage is released as its last tensor moves, so the peak is one copy plus the largest
storage. PAGEDLLM_WEIGHT_ARENA=0 leaves the weights as loaded (to measure the
difference).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from pagedllm.worker.anonymous_memory import anonymous_bytes

logger = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
ALIGN = 64  # each storage starts on a cache line
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


#: module attributes that hold weights outside torch's parameters and buffers: a linear
#: layer's method, MoE experts' quantized weights (`quant`) and dense grouped stacks (`packed`)
HOLDER_ATTRS = ("quant", "method", "packed")


def weight_holders(model: nn.Module) -> Iterator[object]:
    """Every distinct object with a `relocate(place)` that the model's modules hold at
    `HOLDER_ATTRS` (directly or in a tuple; a tied one once)."""
    seen: set[int] = set()
    for module in model.modules():
        for name in HOLDER_ATTRS:
            value = getattr(module, name, None)
            for holder in value if isinstance(value, tuple) else (value,):
                if callable(getattr(holder, "relocate", None)) and id(holder) not in seen:
                    seen.add(id(holder))
                    yield holder


def _visit(model: nn.Module, place: Callable[[torch.Tensor], torch.Tensor]) -> None:
    for module in model.modules():
        for p in list(module.parameters(recurse=False)):
            place(p)  # a Parameter keeps its identity: its .data moves
        for name, b in list(module.named_buffers(recurse=False)):
            if b is not None:
                setattr(module, name, place(b))
    for holder in weight_holders(model):
        holder.relocate(place)


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [first, end) of its storage that tensor `t` reads."""
    size = t.element_size()
    last = sum((n - 1) * s for n, s in zip(t.size(), t.stride(), strict=True))
    return t.storage_offset() * size, (t.storage_offset() + last + 1) * size


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def thp_mode() -> str:
    """The kernel's transparent huge page setting ("always", "madvise", "never", or
    "unknown" where /sys does not say)."""
    try:
        text = THP_SETTING.read_text()
    except OSError:
        return "unknown"
    return text[text.index("[") + 1:text.index("]")] if "[" in text else "unknown"


def into_huge_pages(model: nn.Module) -> int:
    """Move the CPU model's weights into one huge-page mapping (module docstring); returns
    the bytes moved (0 when off, nothing is on the CPU, or the platform has no anonymous
    mappings)."""
    if os.environ.get("PAGEDLLM_WEIGHT_ARENA", "1") == "0":
        return 0
    spans: dict[int, tuple[int, int]] = {}  # storage -> bytes its weights read

    def measure(t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu" and t.numel():
            first, end = _span(t)
            first -= first % ALIGN  # each tensor keeps its alignment in the storage
            lo, hi = spans.get(_storage_key(t), (first, end))
            spans[_storage_key(t)] = (min(lo, first), max(hi, end))
        return t

    _visit(model, measure)
    total = sum(_aligned(hi - lo) for lo, hi in spans.values())
    if not total or (arena := anonymous_bytes(total + HUGE_PAGE, "MADV_HUGEPAGE")) is None:
        return 0
    start = (-arena.data_ptr()) % HUGE_PAGE  # the first byte on a 2 MiB boundary
    offsets: dict[int, int] = {}  # storage -> where its span begins in the arena

    def place(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cpu" or not t.numel():
            return t
        nonlocal start
        key = _storage_key(t)
        lo, hi = spans[key]
        if key not in offsets:
            offsets[key] = start
            old = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
            arena[start:start + hi - lo].copy_(old[lo:hi])
            start += _aligned(hi - lo)
        size = t.element_size()
        first = offsets[key] + t.storage_offset() * size - lo
        view = torch.empty(0, dtype=t.dtype).set_(arena.untyped_storage(), first // size,
                                                   t.size(), t.stride())
        if isinstance(t, nn.Parameter):
            t.data = view
            return t
        return view

    _visit(model, place)
    logger.info("weights: %.1f MiB in one mapping advised for huge pages (THP: %s)",
                total / 2**20, thp_mode())
    return total
