"""The CPU swap pool's bookkeeping: a preempted request's KV blocks parked in host memory.

Swap preemption (`--preemption-mode swap`) moves a victim's blocks to a separate pool of
`num_blocks` CPU blocks with their own ids (tensors: worker.cache_engine), so the request
keeps `num_computed_tokens` and, once device blocks free up, continues without recomputing::

    swap out:  device block_ids [7, 3, 9]  --copy-->  CPU swapped_block_ids [0, 1, 2]
               then the device blocks are released exactly as `BlockManager.free` does
               (a block shared with a sibling or another request stays with its holders)
    swap in:   fresh device blocks [4, 5, 8] <--copy-- CPU [0, 1, 2], CPU blocks freed

The copies are queued here as (src, dst) pairs and handed to the runner with the step's
SchedulerOutput; it executes swap-outs, then swap-ins, then copy-on-write copies, all before
the forward pass (a device block a swap-out released may be reused in the same step).
Swapped-in blocks are private (refcount 1) and uncached; the prefix cache registers them
again after the request's next step, like any newly full blocks.

With several KV groups (core/kv_groups.py) every group's real blocks are swapped, after the
sliding groups have dropped what fell out of their window; `request.swapped_layout` keeps
each table's shape (leading NULL_BLOCK entries, CPU blocks) so swap-in rebuilds it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from pagedllm.core.block_manager import BlockInvariantError, BlockManager
from pagedllm.core.kv_groups import NULL_BLOCK, cdiv
from pagedllm.core.request import Request, RequestStatus


class SwapManager:
    """Free list and block tables of the CPU swap pool (not the tensors)."""

    def __init__(self, num_blocks: int, block_manager: BlockManager) -> None:
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_manager = block_manager
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.pending_swap_out: list[tuple[int, int]] = []  # (device block, CPU block)
        self.pending_swap_in: list[tuple[int, int]] = []   # (CPU block, device block)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def usage(self) -> float:
        """Fraction of CPU blocks in use (0.0 - 1.0; 0.0 for an empty pool)."""
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0

    def swap_out(self, request: Request) -> bool:
        """Park a running request's blocks on the CPU and release the device blocks.

        Returns False (and changes nothing) when the swap pool lacks room or the request
        holds no blocks: the caller then preempts by recompute.
        """
        bm = self.block_manager
        bm.free_out_of_window(request)
        real = [[b for b in t if not bm.is_null(b)] for t in request.block_tables]
        device_ids = [b for t in real for b in t]
        if not device_ids or len(device_ids) > self.num_free_blocks:
            return False
        cpu_ids = [self.free_blocks.popleft() for _ in device_ids]
        self.pending_swap_out.extend(zip(device_ids, cpu_ids, strict=True))
        request.swapped_layout = [(len(t) - len(r), len(r))
                                  for t, r in zip(request.block_tables, real, strict=True)]
        bm.free(request)
        request.swapped_block_ids = cpu_ids
        request.status = RequestStatus.SWAPPED
        return True

    def swap_in(self, request: Request, num_new_tokens: int) -> bool:
        """Bring a swapped request back into fresh device blocks and make room for its next
        `num_new_tokens` tokens; False (and nothing changes) when too few blocks are free."""
        bm = self.block_manager
        cpu_ids = request.swapped_block_ids
        blocks = cdiv(request.num_computed_tokens + num_new_tokens, bm.block_size)
        need = sum(max(lead + n, blocks) - lead for lead, n in request.swapped_layout)
        if need > bm.num_free_blocks:
            return False
        fresh = bm.take_blocks(len(cpu_ids))
        it = iter(fresh)
        request.block_tables = [[NULL_BLOCK] * lead + [next(it) for _ in range(n)]
                                for lead, n in request.swapped_layout]
        request.num_cached_blocks = 0
        self.pending_swap_in.extend(zip(cpu_ids, fresh, strict=True))
        if not bm.allocate_slots(request, num_new_tokens):
            raise BlockInvariantError(f"no room for {request} after its swap-in")
        self._release(request)
        request.status = RequestStatus.RUNNING
        return True

    def free(self, request: Request) -> None:
        """Drop a swapped request's CPU blocks (it finished or was aborted while swapped)."""
        self._release(request)

    def _release(self, request: Request) -> None:
        self.free_blocks.extend(request.swapped_block_ids)
        request.swapped_block_ids = []
        request.swapped_layout = []

    def take_pending(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """This step's (swap-out, swap-in) copies, for the runner; clears the queues."""
        out, self.pending_swap_out = self.pending_swap_out, []
        into, self.pending_swap_in = self.pending_swap_in, []
        return out, into

    # ------------------------------------------------------------ invariants
    def check_invariants(self, requests: Iterable[Request]) -> None:
        """Every CPU block is free or held by exactly one swapped request; swapped requests
        hold no device blocks and their CPU blocks cover their computed tokens."""
        holders = [0] * self.num_blocks
        for req in requests:
            if req.status != RequestStatus.SWAPPED:
                if req.swapped_block_ids:
                    raise BlockInvariantError(f"{req} is not swapped but holds CPU blocks")
                continue
            if any(req.block_tables):
                raise BlockInvariantError(f"swapped {req} still holds device blocks")
            if sum(n for _, n in req.swapped_layout) != len(req.swapped_block_ids) or any(
                    (lead + n) * self.block_manager.block_size < req.num_computed_tokens
                    for lead, n in req.swapped_layout):
                raise BlockInvariantError(f"swapped {req} has computed tokens beyond its blocks")
            for bid in req.swapped_block_ids:
                holders[bid] += 1
        free = set(self.free_blocks)
        if len(free) != len(self.free_blocks):
            raise BlockInvariantError("a CPU block is in the swap free list twice")
        for bid, n in enumerate(holders):
            if n + (bid in free) != 1:
                raise BlockInvariantError(
                    f"CPU block {bid}: held by {n} swapped requests, "
                    f"{'free' if bid in free else 'not free'}")
