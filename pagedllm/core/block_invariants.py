"""The block manager's invariants, checked by tests after every operation (and cheap enough
to run in a fuzz loop):

- every block is exactly one of free / in use; refcount == number of table entries naming it;
- a live request's tables cover its computed tokens in every group; a sliding group's
  NULL_BLOCK entries form a prefix of its table and lie wholly before the window of the
  request's next query; NULL_BLOCK itself is never free and never counted;
- finished and swapped requests hold no device blocks;
- the prefix cache's map and tree agree with the blocks and the tables, and every companion
  block of a sliding (or second full) group sits beside its group-0 block in each table that
  holds it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedllm.core.kv_groups import NULL_BLOCK
from pagedllm.core.request import Request, RequestStatus
from pagedllm.errors import InvariantError

if TYPE_CHECKING:
    from pagedllm.core.block_manager import BlockManager


class BlockInvariantError(InvariantError):
    """The block accounting is inconsistent (a bug, never a user error)."""


def _error(message: str) -> BlockInvariantError:
    return BlockInvariantError(message)


def _check_tables(bm: BlockManager, req: Request, holders: list[int]) -> None:
    bs = bm.block_size
    if len(req.block_tables) not in (1, bm.layout.num_groups) or (
            len(req.block_tables) == 1 and bm.layout.num_groups > 1 and req.block_ids):
        raise _error(f"{req} has {len(req.block_tables)} block tables for "
                     f"{bm.layout.num_groups} KV groups")
    for group, table in zip(bm.layout.groups, req.block_tables, strict=False):
        real = [b for b in table if not bm.is_null(b)]
        if len(set(real)) != len(real):
            raise _error(f"{req} holds a block twice: {table}")
        if len(table) * bs < req.num_computed_tokens:
            raise _error(f"{req} has computed tokens beyond its blocks ({group.kind} group)")
        nulls = len(table) - len(real)
        if nulls:
            if not group.drops_blocks:
                raise _error(f"{req}: the {group.kind} group's table has NULL_BLOCK")
            if any(bm.is_null(b) for b in table[nulls:]):
                raise _error(f"{req}: NULL_BLOCK entries are not a prefix of {table}")
            if nulls > group.first_useful_block(req.num_computed_tokens, bs):
                raise _error(f"{req}: a block inside the window was freed ({table})")
        for bid in real:
            holders[bid] += 1


def check_block_invariants(bm: BlockManager, requests: list[Request]) -> None:
    holders = [0] * bm.num_blocks
    for req in requests:
        if req.is_finished or req.status == RequestStatus.SWAPPED:
            # A finished request's computed-token count is stale history; a swapped one's
            # KV is in the CPU swap pool (core/swap_manager.py). Neither holds device blocks.
            if any(req.block_tables):
                state = "finished" if req.is_finished else "swapped"
                raise _error(f"{state} {req} still holds blocks on the device")
            continue
        if req.num_cached_blocks * bm.block_size > req.num_computed_tokens:
            raise _error(f"{req} counts uncomputed blocks as cached")
        _check_tables(bm, req, holders)
    for block in bm.blocks:
        in_free = block.block_id in bm.free_queue
        if bm.is_null(block.block_id):
            if in_free or block.ref_cnt or block.block_hash is not None:
                raise _error("NULL_BLOCK is free, counted or cached")
            continue
        if block.ref_cnt != holders[block.block_id]:
            raise _error(f"block {block.block_id}: ref_cnt {block.ref_cnt} but held by "
                         f"{holders[block.block_id]} block tables")
        if in_free == (block.ref_cnt > 0):
            state = "free" if in_free else "not free"
            raise _error(f"block {block.block_id} is {state} with ref_cnt {block.ref_cnt}")
    if bm.prefix_cache is not None:
        for problem in bm.prefix_cache.problems(requests):
            raise _error(problem)
    elif any(b.block_hash is not None for b in bm.blocks):
        raise _error("a block carries a hash with prefix caching disabled")
    if bm.companions is not None:
        _check_companions(bm, requests)


def _check_companions(bm: BlockManager, requests: list[Request]) -> None:
    comp = bm.companions
    for g, table in enumerate(comp.by_group):
        for full_block, block in table.items():
            if comp.owner.get(block) != (g, full_block) or block == NULL_BLOCK:
                raise _error(f"companion map and owners disagree on block {block}")
            if bm.blocks[full_block].block_hash is None:
                raise _error(f"block {block} is the companion of uncached block {full_block}")
    if sum(map(len, comp.by_group)) != len(comp.owner):
        raise _error("companion owners list blocks the map does not")
    for req in requests:
        if req.is_finished or req.status == RequestStatus.SWAPPED:
            continue
        for g, table in enumerate(req.block_tables[1:], 1):
            for i, bid in enumerate(table):
                owner = comp.owner.get(bid)
                if owner is not None and (owner[0] != g or i >= len(req.block_ids)
                                          or req.block_ids[i] != owner[1]):
                    raise _error(f"{req}: companion {bid} at index {i} of group {g} is not "
                                 f"beside its group-0 block {owner[1]}")
