"""The data-parallel router: least loaded with turns on ties, prefix affinity within the
balance threshold, dead replicas out of rotation."""

from __future__ import annotations

import pytest

from pagedllm.data_parallel.router import PrefixAffinityRouter, prefix_hashes

PREFIX = list(range(100, 132))  # two full blocks of 16


def test_prefix_hashes_cover_full_blocks_and_salt():
    assert len(prefix_hashes(list(range(40)), 16)) == 2
    assert prefix_hashes(list(range(15)), 16) == []
    assert prefix_hashes(PREFIX, 16) != prefix_hashes(PREFIX, 16, salt="tenant")


def test_least_loaded_takes_turns_and_prefix_sticks():
    r = PrefixAffinityRouter(2, 16, balance_threshold=4)
    assert [r.route([i]) for i in range(4)] == [0, 1, 0, 1]  # no full block: least loaded
    first = r.route(PREFIX + [1])
    assert all(r.route(PREFIX + [i]) == first for i in range(2, 6))
    # Affinity yields once its replica is `balance_threshold` ahead of the least loaded.
    assert r.load[first] - r.load[1 - first] == 5
    assert r.route(PREFIX + [9]) == 1 - first


def test_finished_and_dead_replicas():
    r = PrefixAffinityRouter(2, 16)
    owner = r.route(PREFIX)
    r.finished(owner)
    assert r.load == [0, 0]
    r.mark_dead(owner)
    assert r.route(PREFIX) == 1 - owner  # its prefixes go elsewhere now
    r.mark_dead(1 - owner)
    with pytest.raises(RuntimeError, match="no data-parallel replica"):
        r.route([1])
