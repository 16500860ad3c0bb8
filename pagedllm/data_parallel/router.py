"""Which replica serves a request: least loaded, with prefix-cache affinity.

A prompt's full blocks are chain-hashed like the engine's prefix cache (block i's hash
covers blocks 0..i and the cache salt). The router remembers, for each hash, the replica it
last sent that prefix to (a bounded LRU table). A new request goes to the replica holding
its longest known prefix unless that replica has `balance_threshold` more requests in
flight than the least loaded one; otherwise (or with no known prefix) to the least loaded,
ties taken in turn::

    prompt blocks  [b0 b1 b2 b3]      table: h(b0..b1) -> replica 1
    longest known prefix: 2 blocks -> replica 1 (if its load <= min load + threshold)
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


def prefix_hashes(token_ids: list[int], block_size: int, salt: str | None = None) -> list[int]:
    """Chain hashes of the prompt's full blocks (first block first)."""
    hashes: list[int] = []
    parent = hash(("pagedllm-dp", salt))
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start:start + block_size])))
        hashes.append(parent)
    return hashes


@dataclass
class PrefixAffinityRouter:
    num_replicas: int
    block_size: int
    balance_threshold: int = 8
    max_entries: int = 1 << 16
    load: list[int] = field(init=False)
    alive: list[bool] = field(init=False)
    routed: list[int] = field(init=False)  # requests sent to each replica, ever

    def __post_init__(self) -> None:
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {self.num_replicas}")
        self.load = [0] * self.num_replicas
        self.alive = [True] * self.num_replicas
        self.routed = [0] * self.num_replicas
        self._table: OrderedDict[int, int] = OrderedDict()
        self._turn = 0

    def route(self, token_ids: list[int], salt: str | None = None) -> int:
        """The replica for a new request (counted as in flight there); raises RuntimeError
        when no replica is alive."""
        live = [r for r in range(self.num_replicas) if self.alive[r]]
        if not live:
            raise RuntimeError("no data-parallel replica is alive")
        least = min(self.load[r] for r in live)
        hashes = prefix_hashes(token_ids, self.block_size, salt)
        choice = None
        for h in reversed(hashes):
            owner = self._table.get(h)
            if owner is not None and self.alive[owner]:
                if self.load[owner] - least <= self.balance_threshold:
                    choice = owner
                break
        if choice is None:
            tied = [r for r in live if self.load[r] == least]
            choice = tied[self._turn % len(tied)]
            self._turn += 1
        for h in hashes:
            self._table[h] = choice
            self._table.move_to_end(h)
        while len(self._table) > self.max_entries:
            self._table.popitem(last=False)
        self.load[choice] += 1
        self.routed[choice] += 1
        return choice

    def finished(self, replica: int) -> None:
        self.load[replica] = max(0, self.load[replica] - 1)

    def mark_dead(self, replica: int) -> None:
        """Take a replica out of rotation (its prefixes route elsewhere from now on)."""
        self.alive[replica] = False
        self.load[replica] = 0
