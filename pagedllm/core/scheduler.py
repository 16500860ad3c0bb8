"""Token-budget scheduler (vLLM v1 style): no prefill/decode phases.

Each step hands out at most `max_num_batched_tokens` tokens to at most `max_num_seqs`
requests. Running requests go first, in admission order, each getting `num_tokens -
num_computed_tokens` new tokens (1 when decoding, a chunk of the prompt when prefilling),
capped by what is left of the budget; then waiting requests are admitted while the budget,
`max_num_seqs` and free blocks allow. A long prompt therefore spreads over several steps
(chunked prefill) while other requests keep decoding. An n > 1 request fans out into n
running sequences after its prompt, which can leave more than `max_num_seqs` running; the
ones past the cap keep their blocks and wait their turn.

When a running request needs a block and none is free, the most recently admitted running
request is preempted by recompute: its blocks are freed, `num_computed_tokens` goes back to
0 and it is put at the front of the waiting queue; on resumption its prompt plus the tokens
it had generated are prefilled again, so its output is unchanged. With a `SwapManager`
(preemption mode "swap") the victim's blocks are copied to the CPU swap pool instead and it
joins the swapped queue, keeping `num_computed_tokens`; when the swap pool is full it falls
back to recompute. Swapped requests are swapped back in (oldest first) before any waiting
request is admitted, and no waiting request is admitted while one is still swapped out::

    running ──preempt──▶ swapped (CPU) ──swap in, next steps with free blocks──▶ running
       └──────preempt, swap pool full──▶ waiting (recompute)

With prefix caching, a request admitted from the waiting queue first takes the cached blocks
holding the longest prefix of its tokens: `num_computed_tokens` starts at hits x block_size
and only the rest is prefilled (a resumed request usually finds its own blocks again). After
each forward pass the newly full blocks are registered in the cache (`update_computed`).

Blocks are counted over every KV group (core/kv_groups.py) by `BlockManager.allocate_slots`:
a request of a sliding-window model needs its full-attention blocks plus, per sliding group,
only the blocks inside the window (the others went back to the pool), so admission and
preemption see the memory long sequences really hold.

With the "priority" policy (core/waiting_queue.py) the waiting queue is ordered by (priority,
arrival), lower first, and the preemption victim is the running request with the highest
priority value (the latest arrived among equals) instead of the most recently admitted.

With LoRA (`max_loras`), a waiting request whose adapter would make the running batch hold more
than `max_loras` distinct adapters is passed over (it keeps its place) until one drains.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from pagedllm.core.block_manager import BlockManager
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.swap_manager import SwapManager
from pagedllm.core.waiting_queue import WaitingQueue

logger = logging.getLogger(__name__)


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # query tokens this step, draft tokens included
    # Speculative decoding: the last `num_spec_tokens` query tokens are the request's first
    # draft tokens (`request.spec_token_ids`); their KV counts as computed only once accepted.
    num_spec_tokens: int = 0

    @property
    def samples(self) -> bool:
        """True when this step computes the request's last known token, so it samples."""
        req = self.request
        return (req.num_computed_tokens + self.num_new_tokens
                == req.num_tokens + self.num_spec_tokens)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    # (device block, CPU block) and (CPU block, device block) pairs; the runner executes
    # swap-outs, then swap-ins, then blocks_to_copy, all before the forward pass.
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)   # by recompute or swap
    swapped_out: list[Request] = field(default_factory=list)  # the preempted by swap
    swapped_in: list[Request] = field(default_factory=list)
    # Tokens of the requests admitted this step, and how many of them the prefix cache had.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        """Nothing to run and no blocks to move (a step whose requests were all swapped out
        still has its swap-outs to execute)."""
        return not (self.scheduled or self.blocks_to_swap_out or self.blocks_to_swap_in
                    or self.blocks_to_copy)


class Scheduler:
    """Decides, each step, which requests run and how many tokens each computes."""

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int,
                 swap_manager: SwapManager | None = None, max_loras: int | None = None,
                 policy: str = "fcfs") -> None:
        self.block_manager = block_manager
        self.swap_manager = swap_manager  # None: preempt by recompute only
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.max_loras = max_loras
        self.waiting = WaitingQueue(policy)
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.num_preemptions = 0
        self.num_swap_outs = 0

    # ---------------------------------------------------------------- queues
    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def add_running(self, request: Request) -> None:
        """Append a forked n > 1 sibling that already holds (shared) blocks to the running queue."""
        self.running.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    @property
    def requests(self) -> list[Request]:
        return [*self.running, *self.swapped, *self.waiting]

    def finish_requests(self, requests: list[Request], status: RequestStatus) -> None:
        """`finish_request` for many: the waiting ones leave their queue in one pass (an
        aborted 20,000-prompt call must not cost 20,000 scans of the queue)."""
        waiting = [r for r in requests if r.status == RequestStatus.WAITING]
        self.waiting.remove_many(waiting)
        now = time.monotonic()
        for r in waiting:
            r.status = status
            r.times.finished = now
            self.block_manager.free(r)
        for r in requests:
            if not r.is_finished:
                self.finish_request(r, status)

    def finish_request(self, request: Request, status: RequestStatus) -> None:
        """Remove a request from whichever queue holds it and free its blocks."""
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.WAITING:
            self.waiting.remove(request)
        elif request.status == RequestStatus.SWAPPED:
            self.swapped.remove(request)
            self.swap_manager.free(request)
        request.status = status
        request.times.finished = time.monotonic()
        self.block_manager.free(request)

    # -------------------------------------------------------------- schedule
    def preempt(self, victim: Request) -> bool:
        """Preempt a running request: swap its blocks out to the CPU pool when there is one
        with room (True), else by recompute: free its blocks, requeue it first (False)."""
        if victim.status != RequestStatus.RUNNING:
            raise ValueError(f"only a running request can be preempted, not {victim}")
        if victim in self.running:
            self.running.remove(victim)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        if self.swap_manager is not None and self.swap_manager.swap_out(victim):
            # Older victims of the same step go in front: the oldest is swapped in first.
            self.swapped.appendleft(victim)
            self.num_swap_outs += 1
            logger.debug("preempted %s (swap, %d blocks)", victim.request_id,
                         len(victim.swapped_block_ids))
            return True
        self.block_manager.free(victim)
        victim.status = RequestStatus.WAITING
        victim.num_computed_tokens = 0
        self.waiting.appendleft(victim)
        logger.debug("preempted %s (recompute)", victim.request_id)
        return False

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        i = 0
        while i < len(self.running) and budget > 0 and len(out.scheduled) < self.max_num_seqs:
            req = self.running[i]
            num_known = req.num_tokens - req.num_computed_tokens
            # A decoding request verifies its draft tokens in the same pass (1 + k queries).
            num_drafts = len(req.spec_token_ids) if num_known == 1 else 0
            num_new = min(num_known + num_drafts, budget)
            if num_new > num_known and not bm.allocate_slots(req, num_new):
                num_new = min(num_known, budget)  # no room for the drafts: never preempt for them
            while not bm.allocate_slots(req, num_new):
                j = self._victim_index()
                victim = self.running.pop(j)
                if j < i:  # (priority) already scheduled this step: take it back
                    i -= 1
                    k = next(k for k, s in enumerate(out.scheduled) if s.request is victim)
                    budget += out.scheduled.pop(k).num_new_tokens
                if self.preempt(victim):
                    out.swapped_out.append(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            else:
                out.scheduled.append(ScheduledRequest(req, num_new, max(0, num_new - num_known)))
                budget -= num_new
                i += 1
                continue
            break  # `req` itself was preempted: nothing after it can run either
        if not out.preempted:
            budget = self._swap_in(out, budget)
        if not out.preempted and not self.swapped:
            loras = {r.lora.weights_hash for r in self.running if r.lora is not None}
            passed_over: list[Request] = []
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                if req.lora is not None and req.lora.weights_hash not in loras:
                    if len(loras) >= (self.max_loras or 0):
                        passed_over.append(self.waiting.popleft())
                        continue
                    loras.add(req.lora.weights_hash)
                hits = bm.get_computed_blocks(req)
                num_cached = len(hits) * bm.block_size
                num_new = min(req.num_tokens - num_cached, budget)
                if not bm.allocate_slots(req, num_new, hits):
                    break
                req.num_computed_tokens = num_cached
                if req.num_cached_tokens is None:
                    req.num_cached_tokens = num_cached
                if bm.enable_caching:
                    out.prefix_cache_queries += req.num_tokens
                    out.prefix_cache_hits += num_cached
                self.waiting.popleft()
                req.status = RequestStatus.RUNNING
                if req.times.first_scheduled is None:
                    req.times.first_scheduled = time.monotonic()
                self.running.append(req)
                out.scheduled.append(ScheduledRequest(req, num_new))
                budget -= num_new
            self.waiting.extendleft(reversed(passed_over))
        out.blocks_to_copy = bm.take_pending_copies()
        if self.swap_manager is not None:
            out.blocks_to_swap_out, out.blocks_to_swap_in = self.swap_manager.take_pending()
        return out

    def _victim_index(self) -> int:
        """Where in `running` the request to preempt is: the last admitted (fcfs), or the
        one with the highest priority value, the latest arrived among equals."""
        if not self.waiting.by_priority:
            return len(self.running) - 1
        return max(range(len(self.running)),
                   key=lambda j: (self.running[j].priority, self.running[j].times.arrival, j))

    def _swap_in(self, out: SchedulerOutput, budget: int) -> int:
        """Move swapped requests back to the running batch, oldest first, while the budget,
        `max_num_seqs` and free blocks allow; each is scheduled in this step. Returns the
        budget left."""
        while self.swapped and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.swapped[0]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            if not self.swap_manager.swap_in(req, num_new):
                break
            self.swapped.popleft()
            self.running.append(req)
            out.swapped_in.append(req)
            out.scheduled.append(ScheduledRequest(req, num_new))
            budget -= num_new
        return budget

    def update_computed(self, out: SchedulerOutput) -> None:
        """After the forward pass: the scheduled tokens' KV is now in the cache; blocks it
        filled are registered in the prefix cache. Draft tokens are left out: the
        speculative decoder commits the accepted ones once they are appended."""
        for s in out.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens - s.num_spec_tokens
            self.block_manager.cache_full_blocks(s.request)
