"""Timing a callable for the benchmarks: untimed warm-up calls, then each call's seconds (the
caller takes the median, or the minimum on a machine shared with other work)."""

from __future__ import annotations

import time
from collections.abc import Callable


def run_times(fn: Callable[[], object], reps: int, warmup: int = 1) -> list[float]:
    """Seconds of each of `reps` calls of `fn`, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times
