"""KV cache groups: full-attention layers and sliding-window layers keep separate block tables
(vLLM v1's hybrid KV cache manager), so a sliding group gives blocks that fall out of its
window back to the pool while a full-attention group keeps all of them.

Layers are grouped so that every group has the same number of layers (`layers_per_block`):
then one block of the shared pool holds the KV of one group's layers for `block_size`
tokens, whichever group it serves, and every group allocates from the same free queue.
Gemma 3 270M (18 layers, every 6th full): 3 layers per block, groups::

    group 0  full     layers  5 11 17     table [b0 b1 b2 b3 b4 b5 b6 b7]    keeps every block
    group 1  sliding  layers  0  1  2     table [ N  N  N b9 b4' ...]         N = NULL_BLOCK
    ...      (5 sliding groups of 3)

A sliding table stays positional (entry i covers positions i*bs .. i*bs+bs-1) so slots and
attention index it as usual; entries wholly before the window of the next query are
replaced by the reserved `NULL_BLOCK` (never allocated, never written, masked by
attention). A step that computes tokens from position c reads keys from c - window + 1 on
(key j is visible to the query at p iff p - window < j <= p), so the first block it needs is
(c - window + 1) // block_size::

    window 8, block_size 4, c = 13:  first useful position 6 -> block 1
    table  [ N | b1 (4..7) | b2 (8..11) | b3 (12..15) ]

The pool tensor is `[layers_per_block, 2, num_blocks, ...]`: layer l uses slot
`slot_of(l)` of every block its group's table names (worker/cache_engine.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

NULL_BLOCK = 0  # reserved in a layout with sliding groups: what out-of-window entries name


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KVGroup:
    """The KV spec of layers sharing one block table: their attention `window` (None: full
    attention), which the attention backend's metadata builder reads, and whether blocks
    that leave the window go back to the pool (`free_out_of_window`; False when every layer
    shares one table though some are sliding: `--disable-hybrid-kv-cache-manager`, TP), which
    the block manager reads. The pool's element type and shape are the same for every group
    (`config.kv_cache.KVCacheSpec`): a block serves any group."""

    layers: tuple[int, ...]
    window: int | None = None
    free_out_of_window: bool = True

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"sliding window must be >= 1, got {self.window}")

    @property
    def drops_blocks(self) -> bool:
        """Blocks before the window go back to the pool (NULL_BLOCK in the table)."""
        return self.window is not None and self.free_out_of_window

    @property
    def kind(self) -> str:
        if self.window is None:
            return "full"
        return f"sliding {self.window}" + ("" if self.free_out_of_window else " (keeps blocks)")

    def first_useful_block(self, num_computed: int, block_size: int) -> int:
        """Index of the first block that a step computing from position `num_computed` on
        (or any later step) reads; blocks before it can be freed."""
        if not self.drops_blocks:
            return 0
        return max(0, num_computed - self.window + 1) // block_size

    def max_blocks(self, seq_len: int, block_size: int, chunk: int = 1) -> int:
        """Most blocks a sequence of `seq_len` tokens holds in this group while a step
        computes `chunk` tokens (1 when decoding)."""
        full = cdiv(seq_len, block_size)
        if not self.drops_blocks:
            return full
        return min(full, cdiv(self.window - 1 + chunk, block_size) + 1)


@dataclass(frozen=True)
class KVGroupLayout:
    """The model's layers split into equal-size KV groups, full-attention groups first."""

    groups: tuple[KVGroup, ...]
    layers_per_block: int

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("a KV layout needs at least one group")
        if any(len(g.layers) > self.layers_per_block for g in self.groups):
            raise ValueError(f"a group holds more than {self.layers_per_block} layers")

    @classmethod
    def single(cls, num_layers: int, window: int | None = None,
               free_out_of_window: bool = True) -> KVGroupLayout:
        """Every layer in one group (the layout when all layers attend alike, or when
        one table must serve all of them: then `free_out_of_window=False`)."""
        return cls((KVGroup(tuple(range(num_layers)), window, free_out_of_window),),
                   num_layers)

    @classmethod
    def one_table(cls, windows: Sequence[int | None]) -> KVGroupLayout:
        """Every layer in one group that keeps all its blocks; its window is the layers'
        common one (None when they differ: the model then applies each layer's own)."""
        common = windows[0] if len(set(windows)) == 1 else None
        return cls.single(len(windows), common, free_out_of_window=False)

    @classmethod
    def from_windows(cls, windows: Sequence[int | None]) -> KVGroupLayout:
        """Group layers by window, vLLM's rule: the group size is the smallest layer count of
        a kind (or the largest, if within 25% of it, to avoid many groups); each kind's
        layers are cut into groups of that size, the last one padded."""
        kinds: dict[int | None, list[int]] = {}
        for layer, w in enumerate(windows):
            kinds.setdefault(w, []).append(layer)
        if len(kinds) == 1:
            (w,) = kinds
            return cls.single(len(windows), w)
        sizes = [len(v) for v in kinds.values()]
        size = max(sizes) if max(sizes) < 1.25 * min(sizes) else min(sizes)
        groups = []
        for w in sorted(kinds, key=lambda w: (w is not None, w or 0)):  # full first
            layers = kinds[w]
            groups += [KVGroup(tuple(layers[i:i + size]), w) for i in range(0, len(layers), size)]
        return cls(tuple(groups), size)

    @property
    def num_groups(self) -> int:
        return len(self.groups)

    @property
    def frees_blocks(self) -> bool:
        """A group drops out-of-window blocks (so the pool reserves NULL_BLOCK)."""
        return any(g.drops_blocks for g in self.groups)

    @property
    def num_layers(self) -> int:
        return sum(len(g.layers) for g in self.groups)

    def slot_of(self, layer: int) -> tuple[int, int]:
        """(group index, slot within a block) of a model layer."""
        for gi, g in enumerate(self.groups):
            if layer in g.layers:
                return gi, g.layers.index(layer)
        raise ValueError(f"layer {layer} is in no KV group")

    def blocks_per_seq(self, seq_len: int, block_size: int, chunk: int = 1) -> int:
        """Pool blocks one sequence of `seq_len` tokens holds at most, all groups."""
        return sum(g.max_blocks(seq_len, block_size, chunk) for g in self.groups)

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for g in self.groups:
            kinds[g.kind] = kinds.get(g.kind, 0) + len(g.layers)
        return ", ".join(f"{n} {k} layers" for k, n in kinds.items()) + (
            f" in {self.num_groups} groups of {self.layers_per_block}")


class CompanionBlocks:
    """Prefix caching for groups other than group 0 (which must be full attention).

    Group 0's cached blocks form the prefix cache's tree, whose lookup checks every token of
    the prefix. A block of group g computed at the same table index as group 0's cached
    block f holds group g's KV of exactly that prefix: it is registered here as f's
    companion in group g. A hit of k group-0 blocks is usable when every group has the
    companions it reads: a full group all k, a sliding group those inside the window of the
    next token. Uncaching f (eviction) drops its companions; taking a companion for other
    tokens drops it alone.
    """

    def __init__(self, num_groups: int) -> None:
        self.by_group: list[dict[int, int]] = [{} for _ in range(num_groups)]  # f -> block
        self.owner: dict[int, tuple[int, int]] = {}   # block -> (group, f)

    def __len__(self) -> int:
        return len(self.owner)

    def __contains__(self, block: int) -> bool:
        """`block` is some group's companion of a cached group-0 block."""
        return block in self.owner

    def register(self, group: int, full_block: int, block: int) -> None:
        if block == NULL_BLOCK or full_block in self.by_group[group] or block in self.owner:
            return
        self.by_group[group][full_block] = block
        self.owner[block] = (group, full_block)

    def get(self, group: int, full_block: int) -> int | None:
        return self.by_group[group].get(full_block)

    def drop(self, block: int) -> None:
        """`block` is taken for other tokens: it is no companion any more."""
        entry = self.owner.pop(block, None)
        if entry is not None:
            del self.by_group[entry[0]][entry[1]]

    def drop_full(self, full_block: int) -> None:
        """Group 0's `full_block` left the prefix cache: its companions leave too."""
        for table in self.by_group:
            block = table.pop(full_block, None)
            if block is not None:
                del self.owner[block]


def hit_tables(layout: KVGroupLayout, companions: CompanionBlocks | None, hits: Sequence[int],
               block_size: int) -> list[list[int]] | None:
    """Every group's table for a prefix-cache hit of group-0 blocks `hits` (sliding groups
    get NULL_BLOCK before their window), or None if a group lacks a block it would read."""
    tables = [list(hits)]
    end = len(hits) * block_size
    for gi, group in enumerate(layout.groups[1:], 1):
        first = group.first_useful_block(end, block_size)
        table = [NULL_BLOCK] * first
        for full_block in hits[first:]:
            block = None if companions is None else companions.get(gi, full_block)
            if block is None:
                return None
            table.append(block)
        tables.append(table)
    return tables


def usable_hit(layout: KVGroupLayout, companions: CompanionBlocks | None, hits: list[int],
               block_size: int) -> list[int]:
    """The longest prefix of group 0's `hits` that every group can use (vLLM's coordinator
    shortens a hit until all groups agree)."""
    while hits and hit_tables(layout, companions, hits, block_size) is None:
        hits = hits[:-1]
    return hits
