"""Token-budget scheduler (vLLM v1 style): no prefill/decode phases.

Each step hands out at most `max_num_batched_tokens` tokens. Running requests go first, in
admission order, each getting `num_tokens - num_computed_tokens` new tokens (1 when decoding,
a chunk of the prompt when prefilling), capped by what is left of the budget; then waiting
requests are admitted while the budget, `max_num_seqs` and free blocks allow. A long prompt
therefore spreads over several steps (chunked prefill) while other requests keep decoding.

When a running request needs a block and none is free, the most recently admitted running
request is preempted by recompute: its blocks are freed, `num_computed_tokens` goes back to
0 and it is put at the front of the waiting queue; on resumption its prompt plus the tokens
it had generated are prefilled again, so its output is unchanged.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from pagedllm.core.block_manager import BlockManager
from pagedllm.core.request import Request, RequestStatus

logger = logging.getLogger(__name__)


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """True when this step computes the request's last known token, so it samples."""
        req = self.request
        return req.num_computed_tokens + self.num_new_tokens == req.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Decides, each step, which requests run and how many tokens each computes."""

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    # ---------------------------------------------------------------- queues
    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def add_running(self, request: Request) -> None:
        """Insert an already-running forked sibling right after nothing else changes."""
        self.running.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def requests(self) -> list[Request]:
        return [*self.running, *self.waiting]

    def finish_request(self, request: Request, status: RequestStatus) -> None:
        """Remove a request from whichever queue holds it and free its blocks."""
        if request.status == RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status == RequestStatus.WAITING:
            self.waiting.remove(request)
        request.status = status
        request.times.finished = time.monotonic()
        self.block_manager.free(request)

    # -------------------------------------------------------------- schedule
    def _preempt(self, victim: Request) -> None:
        self.block_manager.free(victim)
        victim.status = RequestStatus.WAITING
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        logger.debug("preempted %s (recompute)", victim.request_id)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        bm = self.block_manager
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            while not bm.allocate_slots(req, num_new):
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            else:
                out.scheduled.append(ScheduledRequest(req, num_new))
                budget -= num_new
                i += 1
                continue
            break  # `req` itself was preempted: nothing after it can run either
        if not out.preempted:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                num_new = min(req.num_tokens - req.num_computed_tokens, budget)
                if not bm.allocate_slots(req, num_new):
                    break
                self.waiting.popleft()
                req.status = RequestStatus.RUNNING
                if req.times.first_scheduled is None:
                    req.times.first_scheduled = time.monotonic()
                self.running.append(req)
                out.scheduled.append(ScheduledRequest(req, num_new))
                budget -= num_new
        out.blocks_to_copy = bm.take_pending_copies()
        return out

    def update_computed(self, out: SchedulerOutput) -> None:
        """After the forward pass: the scheduled tokens' KV is now in the cache."""
        for s in out.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
