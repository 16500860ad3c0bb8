"""Paged KV-cache block accounting: free queue, refcounts, copy-on-write, prefix cache.

The KV pool holds `num_blocks` blocks of `block_size` token slots. A request's block table
maps its token positions to slots::

    position i  ->  block_ids[i // block_size] * block_size + i % block_size

A new block is taken only when the previous one is full, so appends never copy KV. Blocks may
be shared (n > 1 samples fork the prompt's blocks; prefix-cache hits share full blocks); the
refcount counts the tables holding one. A shared, partly filled block is copied before a
holder writes into it (copy-on-write, queued in `pending_copies` for the runner). Full blocks
are never written again: they are shared as they are, and only they are cached.

Free queue::

    head -> [freed, nothing cached ...] [never used ...] [cached, freed longest ago ...] <- tail
            taken (and evicted from the prefix cache) here       cached blocks appended here

A freed block holding nothing the prefix cache keeps (caching off, a block never full) goes
to the head, so the pool's working set stays at the peak load: its pages are mapped on first
write (worker/cache_engine.py), which in a VM that returns freed memory to its host cost
~3.4 us per 4 KiB page here (taking never-used blocks first, 64 x 128/128 offline rounds
ran at 476-525 instead of 745-949 tok/s, ~5 s in the kernel). Cached blocks keep vLLM v1's
eviction order: a request's blocks are freed last block first (its tail evicted first),
appended at the tail; a cache hit takes a free block out of the queue (LRU order).

KV groups (core/kv_groups.py): one table per group in `request.block_tables` (group 0 is
`request.block_ids`), all taking blocks from this pool; a sliding group frees the blocks that
left its window (`free_out_of_window`) before each allocation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pagedllm.core.block_invariants import BlockInvariantError, check_block_invariants
from pagedllm.core.kv_groups import (
    NULL_BLOCK,
    CompanionBlocks,
    KVGroupLayout,
    cdiv,
    hit_tables,
    usable_hit,
)
from pagedllm.core.prefix_cache import BlockHash, PrefixCache, extra_keys, update_block_hashes
from pagedllm.core.request import Request


@dataclass
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None  # set while the block is in the prefix cache


class BlockManager:
    """Owns the KV block pool's bookkeeping (not the tensors: see worker.cache_engine)."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = False,
                 layout: KVGroupLayout | None = None) -> None:
        self.layout = layout or KVGroupLayout.single(1)
        reserved = 1 if self.layout.frees_blocks else 0  # NULL_BLOCK
        if num_blocks < 1 + reserved:
            raise ValueError(f"num_blocks must be >= {1 + reserved}, got {num_blocks}")
        if enable_caching and self.layout.groups[0].drops_blocks:
            raise ValueError("prefix caching needs a full-attention KV group 0; this layout "
                             f"has only sliding-window layers ({self.layout.describe()})")
        self.num_blocks = num_blocks
        self.num_usable_blocks = num_blocks - reserved
        self.block_size = block_size
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Insertion-ordered: taken from the front; freed to the front or back (module doc).
        self.free_queue: OrderedDict[int, KVBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks[reserved:])
        self.pending_copies: list[tuple[int, int]] = []
        self.prefix_cache = PrefixCache(self.blocks, block_size) if enable_caching else None
        self.companions = (CompanionBlocks(self.layout.num_groups)
                           if enable_caching and self.layout.num_groups > 1 else None)

    # ---------------------------------------------------------------- queries
    @property
    def enable_caching(self) -> bool:
        return self.prefix_cache is not None

    @property
    def num_free_blocks(self) -> int:
        """Blocks no table holds, cached (evictable) ones included."""
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (0.0 - 1.0)."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """New blocks (including copy-on-write copies), all groups, to hold `num_new_tokens`
        more tokens."""
        total = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size)
        return sum(max(0, total - len(table)) + self._needs_cow(request, num_new_tokens, g)
                   for g, table in enumerate(self._tables(request)))

    def _needs_cow(self, request: Request, num_new_tokens: int, group: int = 0) -> bool:
        pos = request.num_computed_tokens
        if num_new_tokens == 0 or pos % self.block_size == 0:
            return False
        idx = pos // self.block_size
        table = self._tables(request)[group]
        return idx < len(table) and self.blocks[table[idx]].ref_cnt > 1

    def _tables(self, request: Request) -> list[list[int]]:
        """The request's block tables, one per group (created empty on first use)."""
        tables = request.block_tables
        while len(tables) < self.layout.num_groups:
            tables.append([])
        return tables

    def get_computed_blocks(self, request: Request) -> list[int]:
        """Group 0's cached blocks holding a prefix of a request that holds no blocks and
        scores no prompt positions (else []), cut to what every group can use."""
        if self.prefix_cache is None or any(request.block_tables) or request.prompt_scoring_pending:
            return []
        return usable_hit(self.layout, self.companions, self.prefix_cache.lookup(request),
                          self.block_size)

    # ------------------------------------------------------------ operations
    def _take_block(self) -> KVBlock:
        _, block = self.free_queue.popitem(last=False)
        if self.prefix_cache is not None and block.block_hash is not None:
            for bid in self.prefix_cache.evict(block.block_id):
                if self.blocks[bid].ref_cnt:
                    raise BlockInvariantError(f"evicted cached block {bid} is in use")
                if self.companions is not None:
                    self.companions.drop_full(bid)
        if self.companions is not None:
            self.companions.drop(block.block_id)
        block.ref_cnt = 1
        return block

    def _touch(self, block_id: int) -> None:
        """One more table holds a (cached) block; a free one leaves the free queue."""
        block = self.blocks[block_id]
        if block.ref_cnt == 0:
            del self.free_queue[block_id]
        block.ref_cnt += 1

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            self.free_queue[block_id] = block
            if not self._keeps_cached_kv(block):  # nothing to keep: the next block taken
                self.free_queue.move_to_end(block_id, last=False)

    def _keeps_cached_kv(self, block: KVBlock) -> bool:
        """A prefix-cache block, or a sliding group's companion of one (core/kv_groups.py)."""
        return block.block_hash is not None or (
            self.companions is not None and block.block_id in self.companions)

    def take_blocks(self, num_blocks: int) -> list[int]:
        """`num_blocks` fresh blocks (refcount 1), e.g. a swap-in's destinations; the caller
        checked `num_free_blocks` and puts them in a block table."""
        if num_blocks > self.num_free_blocks:
            raise BlockInvariantError(f"{num_blocks} blocks wanted, {self.num_free_blocks} free")
        return [self._take_block().block_id for _ in range(num_blocks)]

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: Sequence[int] = ()) -> bool:
        """Make `request`'s block table cover its next `num_new_tokens` tokens.

        `computed_blocks` (from `get_computed_blocks`, for a request holding no blocks) become
        the start of its table and the new tokens follow them (every group's table: see
        `hit_tables`). Sliding groups first give back what left their window. Returns False
        (and changes nothing else) when not enough blocks are free.
        """
        hits = list(computed_blocks)
        tables = self._tables(request)
        if hits and (any(tables) or request.num_computed_tokens):
            raise BlockInvariantError(f"cache hits for {request}, which already has blocks")
        if hits:
            hit = hit_tables(self.layout, self.companions, hits, self.block_size)
            if hit is None:
                raise BlockInvariantError(f"hit {hits} lacks a group's blocks for {request}")
            end = len(hits) * self.block_size + num_new_tokens
            real = [b for t in hit for b in t if not self.is_null(b)]
            need = cdiv(end, self.block_size) * len(hit) - sum(len(t) for t in hit)
            # Hits with refcount 0 sit in the free queue: taking them leaves fewer free.
            need += sum(1 for b in real if self.blocks[b].ref_cnt == 0)
        else:
            self.free_out_of_window(request)
            end = request.num_computed_tokens + num_new_tokens
            need = self.blocks_needed(request, num_new_tokens)
        if need > self.num_free_blocks:
            return False
        if hits:
            for bid in real:
                self._touch(bid)
            tables[:] = hit
            request.num_cached_blocks = len(hits)
        for g, table in enumerate(tables):
            if self._needs_cow(request, num_new_tokens, g):
                idx = request.num_computed_tokens // self.block_size
                src = self.blocks[table[idx]]
                dst = self._take_block()
                src.ref_cnt -= 1
                table[idx] = dst.block_id
                self.pending_copies.append((src.block_id, dst.block_id))
            while len(table) * self.block_size < end:
                table.append(self._take_block().block_id)
        return True

    def free_out_of_window(self, request: Request) -> int:
        """Give back each sliding group's blocks that no step from `num_computed_tokens` on
        reads (NULL_BLOCK takes their place); returns how many were released."""
        released = 0
        for group, table in zip(self.layout.groups, self._tables(request), strict=True):
            stop = min(group.first_useful_block(request.num_computed_tokens, self.block_size),
                       len(table))
            for i in range(stop - 1, -1, -1):  # later ones are evicted first
                if table[i] == NULL_BLOCK:
                    break  # the ones before were freed by an earlier call
                self._release(table[i])
                table[i] = NULL_BLOCK
                released += 1
        return released

    def cache_full_blocks(self, request: Request) -> None:
        """After a step: register the request's newly full, computed blocks in the cache.

        A block whose content is already cached (two requests computed the same prefix in
        one step) is swapped for the cached one and released, so the copies collapse into
        one, unless forked siblings share it too (swapping it for one of them would split
        their common prefix). Registration stops at a hash held by another block.
        """
        start = request.num_cached_blocks
        self._cache_group0(request)
        if self.companions is not None:
            for i in range(start, request.num_cached_blocks):
                for g, table in enumerate(request.block_tables[1:], 1):
                    self.companions.register(g, request.block_ids[i], table[i])

    def _cache_group0(self, request: Request) -> None:
        cache = self.prefix_cache
        bs = self.block_size
        num_full = min(request.num_computed_tokens // bs, len(request.block_ids))
        if cache is None or request.num_cached_blocks >= num_full:
            return
        hashes = update_block_hashes(request, bs)
        extra = extra_keys(request)
        for i in range(request.num_cached_blocks, num_full):
            bid = request.block_ids[i]
            if self.blocks[bid].block_hash is None:  # else a sibling sharing it registered it
                parent = request.block_ids[i - 1] if i else None
                tokens = tuple(request.all_token_ids[i * bs:(i + 1) * bs])
                existing = cache.match(hashes[i], parent, tokens, extra)
                if existing is not None:
                    if self.blocks[bid].ref_cnt > 1:
                        return
                    self._touch(existing)
                    request.block_ids[i] = existing
                    self._release(bid)
                elif not cache.insert(bid, hashes[i], parent, tokens, extra):
                    return
            request.num_cached_blocks = i + 1

    def trim_slots(self, request: Request, num_tokens: int) -> None:
        """Give back the blocks past the first `num_tokens` positions of the table (the
        slots of rejected draft tokens), last block first. Only uncomputed, uncached tail
        blocks can go: `num_tokens` must cover the computed tokens."""
        if num_tokens < request.num_computed_tokens:
            raise BlockInvariantError(f"trimming {request} to {num_tokens} tokens would drop "
                                      "computed KV")
        keep = -(-num_tokens // self.block_size)
        for table in self._tables(request):   # every KV group's tail
            for bid in reversed(table[keep:]):
                self._release(bid)
            del table[keep:]

    def fork(self, parent: Request, child: Request) -> None:
        """Share all of `parent`'s blocks with `child` (refcount + 1 each), every group."""
        child.block_tables = [list(t) for t in parent.block_tables]
        child.num_cached_blocks = parent.num_cached_blocks
        for table in child.block_tables:
            for bid in table:
                if not self.is_null(bid):
                    self.blocks[bid].ref_cnt += 1

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first (see the module doc). Cached ones
        stay findable until evicted. With several groups, position by position from the end."""
        tables = request.block_tables
        for i in range(max(map(len, tables)) - 1, -1, -1):
            for table in tables:
                if i < len(table) and not self.is_null(table[i]):
                    self._release(table[i])
        request.block_tables = [[] for _ in tables]
        request.num_cached_blocks = 0

    def is_null(self, block_id: int) -> bool:
        """`block_id` is the NULL_BLOCK placeholder of an out-of-window entry."""
        return block_id == NULL_BLOCK and self.layout.frees_blocks

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    # ------------------------------------------------------------ invariants
    def check_invariants(self, requests: Iterable[Request]) -> None:
        """Every block is exactly free or in use; refcount == number of tables holding it;
        the prefix cache and the tables agree (core/block_invariants.py)."""
        check_block_invariants(self, list(requests))
