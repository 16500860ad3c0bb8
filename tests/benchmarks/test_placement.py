"""`benchmarks/placement.py`: the round trip of a cache line between the first two CPUs, the
number the multi-threaded benchmarks now record beside their rounds."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.placement import round_trip_ns  # noqa: E402


def test_round_trip_is_a_plausible_time():
    before = os.sched_getaffinity(0)
    ns = round_trip_ns(bounces=200, repeats=1)
    assert os.sched_getaffinity(0) == before  # the caller is not left pinned
    if len(before) < 2:
        assert ns is None
    else:  # tens to hundreds of ns between idle cores; up to a few ms where another process
        assert ns is not None and 10 < ns < 1e7  # holds a CPU (the suite's other worker)
