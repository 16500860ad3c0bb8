"""Host memory straight from the OS: an anonymous private mapping as a uint8 tensor, advised
the page size its user wants (the KV pool asks for 4 KiB pages, the weight arena for
transparent huge pages; worker/cache_engine.py and worker/weight_arena.py say why)."""

from __future__ import annotations

import mmap

import torch


def anonymous_bytes(nbytes: int, advice: str) -> torch.Tensor | None:
    """uint8 [nbytes] over a fresh anonymous private mapping, whose pages the OS zeroes on
    first touch, madvised `advice` (a name of `mmap`: "MADV_HUGEPAGE", "MADV_NOHUGEPAGE")
    where the platform has it; None where it has no anonymous mappings. The tensor holds the
    mapping: it lives as long as the tensor's storage."""
    if nbytes <= 0 or not hasattr(mmap, "MAP_ANONYMOUS"):
        return None
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, advice):
        buf.madvise(getattr(mmap, advice))
    return torch.frombuffer(buf, dtype=torch.uint8)
