"""Paged KV-cache block accounting: free queue, reference counts, copy-on-write, prefix cache,
invariants.

The KV pool holds `num_blocks` blocks of `block_size` token slots. A request's block table
maps its token positions to slots::

    position i  ->  block_ids[i // block_size] * block_size + i % block_size

Appending a token writes one slot; a new block is taken from the free queue only when the
previous one is full, so appends never copy KV. Blocks may be shared by several block tables
(n > 1 samples fork the prompt's blocks; prefix-cache hits share full blocks across
requests); the refcount counts the tables holding a block. A shared block that is only partly
filled is copied before a holder writes into it (copy-on-write); the copies are queued in
`pending_copies` for the runner to execute before the next forward pass. Full blocks are
never written again, so they are shared as they are and only they are cached.

Free queue (with prefix caching, vLLM v1's eviction order)::

    head -> [never used ...] [freed longest ago ...] [freed last] <- tail
            taken (and evicted from the prefix cache) here   freed blocks appended here

A request's blocks are freed last block first, so among them its tail is evicted first and
its first block, the one most likely shared, last. A cache hit on a free block takes it
out of the queue; freeing it again puts it back at the tail (least recently used order).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pagedllm.core.prefix_cache import BlockHash, PrefixCache, extra_keys, update_block_hashes
from pagedllm.core.request import Request, RequestStatus


class BlockInvariantError(AssertionError):
    """The block accounting is inconsistent (a bug, never a user error)."""


@dataclass
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None  # set while the block is in the prefix cache


class BlockManager:
    """Owns the KV block pool's bookkeeping (not the tensors: see worker.cache_engine)."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_caching: bool = False
                 ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Insertion-ordered: taken from the front, freed to the back (see the module doc).
        self.free_queue: OrderedDict[int, KVBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks)
        self.pending_copies: list[tuple[int, int]] = []
        self.prefix_cache = PrefixCache(self.blocks, block_size) if enable_caching else None

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
        return 1.0 - self.num_free_blocks / self.num_blocks

    def blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """New blocks (including a copy-on-write copy) to hold `num_new_tokens` more tokens."""
        total = request.num_computed_tokens + num_new_tokens
        need = max(0, -(-total // self.block_size) - len(request.block_ids))
        return need + (1 if self._needs_cow(request, num_new_tokens) else 0)

    def _needs_cow(self, request: Request, num_new_tokens: int) -> bool:
        pos = request.num_computed_tokens
        if num_new_tokens == 0 or pos % self.block_size == 0:
            return False
        idx = pos // self.block_size
        return idx < len(request.block_ids) and self.blocks[request.block_ids[idx]].ref_cnt > 1

    def get_computed_blocks(self, request: Request) -> list[int]:
        """Cached blocks holding a prefix of a request that holds no blocks yet (else [])."""
        if self.prefix_cache is None or request.block_ids:
            return []
        return self.prefix_cache.lookup(request)

    # ------------------------------------------------------------ operations
    def _take_block(self) -> KVBlock:
        _, block = self.free_queue.popitem(last=False)
        if self.prefix_cache is not None and block.block_hash is not None:
            for bid in self.prefix_cache.evict(block.block_id):
                if self.blocks[bid].ref_cnt:
                    raise BlockInvariantError(f"evicted cached block {bid} is in use")
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
        the start of its table and the new tokens follow them. Returns False (and changes
        nothing) when not enough blocks are free.
        """
        hits = list(computed_blocks)
        if hits and (request.block_ids or request.num_computed_tokens):
            raise BlockInvariantError(f"cache hits for {request}, which already has blocks")
        if hits:
            end = len(hits) * self.block_size + num_new_tokens
            need = -(-end // self.block_size) - len(hits)
            # Hits with refcount 0 sit in the free queue: taking them leaves fewer free.
            need += sum(1 for b in hits if self.blocks[b].ref_cnt == 0)
        else:
            end = request.num_computed_tokens + num_new_tokens
            need = self.blocks_needed(request, num_new_tokens)
        if need > self.num_free_blocks:
            return False
        for bid in hits:
            self._touch(bid)
        if hits:
            request.block_ids = hits
            request.num_cached_blocks = len(hits)
        if self._needs_cow(request, num_new_tokens):
            idx = request.num_computed_tokens // self.block_size
            src = self.blocks[request.block_ids[idx]]
            dst = self._take_block()
            src.ref_cnt -= 1
            request.block_ids[idx] = dst.block_id
            self.pending_copies.append((src.block_id, dst.block_id))
        while len(request.block_ids) * self.block_size < end:
            request.block_ids.append(self._take_block().block_id)
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """After a step: register the request's newly full, computed blocks in the cache.

        A block whose content is already cached (two requests computed the same prefix in
        one step) is swapped for the cached one and released, so the copies collapse into
        one, unless forked siblings share it too (swapping it for one of them would split
        their common prefix). Registration stops at a hash held by another block.
        """
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
        for bid in reversed(request.block_ids[keep:]):
            self._release(bid)
        del request.block_ids[keep:]

    def fork(self, parent: Request, child: Request) -> None:
        """Share all of `parent`'s blocks with `child` (refcount + 1 each)."""
        child.block_ids = list(parent.block_ids)
        child.num_cached_blocks = parent.num_cached_blocks
        for bid in child.block_ids:
            self.blocks[bid].ref_cnt += 1

    def free(self, request: Request) -> None:
        """Release the request's blocks, last block first (see the module doc). Cached ones
        stay findable until evicted."""
        for bid in reversed(request.block_ids):
            self._release(bid)
        request.block_ids = []
        request.num_cached_blocks = 0

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    # ------------------------------------------------------------ invariants
    def check_invariants(self, requests: Iterable[Request]) -> None:
        """Every block is exactly free or in use; refcount == number of tables holding it;
        the prefix cache's map, tree and the tables' cached blocks agree."""
        requests = list(requests)
        holders = [0] * self.num_blocks
        for req in requests:
            if req.is_finished:
                # Its computed-token count is stale history; it must only hold nothing.
                if req.block_ids:
                    raise BlockInvariantError(f"finished {req} still holds blocks")
                continue
            if req.status == RequestStatus.SWAPPED:
                # Its KV is in the CPU swap pool (see core.swap_manager); none on the device.
                if req.block_ids:
                    raise BlockInvariantError(f"swapped {req} still holds device blocks")
                continue
            if len(set(req.block_ids)) != len(req.block_ids):
                raise BlockInvariantError(f"{req} holds a block twice: {req.block_ids}")
            if len(req.block_ids) * self.block_size < req.num_computed_tokens:
                raise BlockInvariantError(f"{req} has computed tokens beyond its blocks")
            if req.num_cached_blocks * self.block_size > req.num_computed_tokens:
                raise BlockInvariantError(f"{req} counts uncomputed blocks as cached")
            for bid in req.block_ids:
                holders[bid] += 1
        for block in self.blocks:
            in_free = block.block_id in self.free_queue
            if block.ref_cnt != holders[block.block_id]:
                raise BlockInvariantError(
                    f"block {block.block_id}: ref_cnt {block.ref_cnt} but held by "
                    f"{holders[block.block_id]} block tables")
            if in_free == (block.ref_cnt > 0):
                state = "free" if in_free else "not free"
                raise BlockInvariantError(
                    f"block {block.block_id} is {state} with ref_cnt {block.ref_cnt}")
        if self.prefix_cache is not None:
            for problem in self.prefix_cache.problems(requests):
                raise BlockInvariantError(problem)
        elif any(b.block_hash is not None for b in self.blocks):
            raise BlockInvariantError("a block carries a hash with prefix caching disabled")
