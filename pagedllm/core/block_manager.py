"""Paged KV-cache block accounting: free queue, reference counts, copy-on-write, invariants.

The KV pool holds `num_blocks` blocks of `block_size` token slots. A request's block table
maps its token positions to slots::

    position i  ->  block_ids[i // block_size] * block_size + i % block_size

Appending a token writes one slot; a new block is taken from the free queue only when the
previous one is full, so appends never copy KV. Blocks may be shared by several block tables
(n > 1 samples fork the prompt's blocks); the refcount counts the tables holding a block. A
shared block that is only partly filled is copied before a holder writes into it
(copy-on-write); the copies are queued in `pending_copies` for the runner to execute before
the next forward pass.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from pagedllm.core.request import Request


class BlockInvariantError(AssertionError):
    """The block accounting is inconsistent (a bug, never a user error)."""


@dataclass
class KVBlock:
    block_id: int
    ref_cnt: int = 0


class BlockManager:
    """Owns the KV block pool's bookkeeping (not the tensors: see worker.cache_engine)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # Insertion-ordered so a later prefix cache can evict least-recently-freed first.
        self.free_queue: OrderedDict[int, KVBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks)
        self.pending_copies: list[tuple[int, int]] = []

    # ---------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
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

    # ------------------------------------------------------------ operations
    def _take_block(self) -> KVBlock:
        _, block = self.free_queue.popitem(last=False)
        block.ref_cnt = 1
        return block

    def allocate_slots(self, request: Request, num_new_tokens: int) -> bool:
        """Make `request`'s block table cover its next `num_new_tokens` tokens.

        Returns False (and changes nothing) when not enough blocks are free.
        """
        if self.blocks_needed(request, num_new_tokens) > self.num_free_blocks:
            return False
        if self._needs_cow(request, num_new_tokens):
            idx = request.num_computed_tokens // self.block_size
            src = self.blocks[request.block_ids[idx]]
            dst = self._take_block()
            src.ref_cnt -= 1
            request.block_ids[idx] = dst.block_id
            self.pending_copies.append((src.block_id, dst.block_id))
        total = request.num_computed_tokens + num_new_tokens
        while len(request.block_ids) * self.block_size < total:
            request.block_ids.append(self._take_block().block_id)
        return True

    def fork(self, parent: Request, child: Request) -> None:
        """Share all of `parent`'s blocks with `child` (refcount + 1 each)."""
        child.block_ids = list(parent.block_ids)
        for bid in child.block_ids:
            self.blocks[bid].ref_cnt += 1

    def free(self, request: Request) -> None:
        """Release the request's blocks. Last block first, so later eviction takes tails first."""
        for bid in reversed(request.block_ids):
            block = self.blocks[bid]
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_queue[bid] = block
        request.block_ids = []

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    # ------------------------------------------------------------ invariants
    def check_invariants(self, requests: Iterable[Request]) -> None:
        """Every block is exactly free or in use; refcount == number of tables holding it."""
        holders = [0] * self.num_blocks
        for req in requests:
            if req.is_finished and req.block_ids:
                raise BlockInvariantError(f"finished {req} still holds blocks")
            if len(set(req.block_ids)) != len(req.block_ids):
                raise BlockInvariantError(f"{req} holds a block twice: {req.block_ids}")
            if len(req.block_ids) * self.block_size < req.num_computed_tokens:
                raise BlockInvariantError(f"{req} has computed tokens beyond its blocks")
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
