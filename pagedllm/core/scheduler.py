"""Token-budget scheduler (vLLM v1 style, no prefill/decode phases); `update_from_output` is
the one place a step's result is applied.

Each step hands out at most `max_num_batched_tokens` tokens to at most `max_num_seqs`
requests: running ones first, in admission order, each `num_tokens - num_computed_tokens` new
tokens (1 decoding, a prompt chunk prefilling) within the budget left; then waiting ones while
budget, `max_num_seqs` and free blocks allow: long prompts spread over steps (chunked
prefill). An n > 1 request fans out after its prompt (past `max_num_seqs`: wait, blocks kept).

When a running request needs a block and none is free, the last admitted running request
is preempted by recompute (blocks freed, `num_computed_tokens` 0, front of the waiting queue;
prefilled again, so its output is unchanged) or, with a `SwapManager` (preemption mode
"swap"), its blocks are copied to the CPU swap pool and it joins the swapped queue (recompute
when the pool is full). Swapped requests come back (oldest first) before any admission::

    running ──preempt──▶ swapped (CPU) ──swap in, next steps with free blocks──▶ running
       └──────preempt, swap pool full──▶ waiting (recompute)

With prefix caching an admitted request first takes the cached blocks of the longest prefix
of its tokens (`num_computed_tokens` starts there); filled blocks are registered after each
forward pass; blocks count over every KV group. "priority" (core/waiting_queue.py) orders
waiting requests by (priority, arrival), preempting the highest value first; a request whose
LoRA adapter would exceed `max_loras` waits. A pooling request is prefill only.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from pagedllm.core.block_manager import BlockManager
from pagedllm.core.multi_step import plan_steps
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.runner_output import RunnerOutput
from pagedllm.core.scheduler_output import (
    ScheduledRequest,
    SchedulerOutput,
    StepUpdate,
    StopStringHit,
)
from pagedllm.core.stop_checks import stop_status
from pagedllm.core.swap_manager import SwapManager
from pagedllm.core.waiting_queue import WaitingQueue

logger = logging.getLogger(__name__)


class Scheduler:
    """Decides, each step, which requests run and how many tokens each computes."""

    def __init__(self, block_manager: BlockManager, *, max_num_seqs: int,
                 max_num_batched_tokens: int, max_model_len: int,
                 swap_manager: SwapManager | None = None, max_loras: int | None = None,
                 policy: str = "fcfs", max_steps: int = 1) -> None:
        self.block_manager = block_manager
        self.swap_manager = swap_manager  # None: preempt by recompute only
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.max_loras = max_loras
        self.max_steps = max_steps  # decode steps one engine step may run (core/multi_step.py)
        self.waiting = WaitingQueue(policy)
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.num_preemptions = 0
        self.num_swap_outs = 0

    # ---------------------------------------------------------------- queues
    def add_request(self, request: Request) -> None:
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

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
        victim.draft_token_ids = []  # proposed again once it decodes
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
            num_drafts = len(req.draft_token_ids) if num_known == 1 else 0
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
        out.num_steps = plan_steps(out, bm, self.max_steps, self.max_model_len,
                                   bool(self.waiting or self.swapped))
        return out

    def _victim_index(self) -> int:
        """Index in `running` of the one to preempt: the last admitted (fcfs), or the highest
        priority value, the latest arrived among equals."""
        if not self.waiting.by_priority:
            return len(self.running) - 1
        return max(range(len(self.running)),
                   key=lambda j: (self.running[j].priority, self.running[j].times.arrival, j))

    def _swap_in(self, out: SchedulerOutput, budget: int) -> int:
        """Swapped requests back to running and scheduled, oldest first, as budget allows."""
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

    # ------------------------------------------------------- apply a result
    def update_from_output(self, sched: SchedulerOutput, out: RunnerOutput) -> StepUpdate:
        """Apply one step's result; the only place that does. The scheduled tokens' KV is
        computed (drafts excepted), full blocks enter the prefix cache, prompt logprobs and
        pooled chunks are kept (a pooled prompt finishes); each sampling request gets its
        tokens (n > 1 fans out first), accepted drafts, freed rejected slots; stop tokens,
        grammars, length finish it (stop_checks.py; stop strings: `apply_stop_strings`)."""
        for s in sched.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens - s.num_draft_tokens
            self.block_manager.cache_full_blocks(s.request)
        for scored in out.prompt_logprobs:
            scored.request.add_prompt_logprobs(scored.first_position, scored.entries)
        update = StepUpdate()
        for chunk in out.pooled:  # a pooling request ends with its prompt: blocks freed now
            if chunk.request.add_pooled(chunk.first_position, chunk.num_positions, chunk.data):
                self.finish_request(chunk.request, RequestStatus.FINISHED_STOPPED)
                update.pooled.append(chunk.request)
        now = time.monotonic()
        for st in out.sampled:
            req = st.request
            if st.error is not None:
                update.errors[req.group_id] = st.error
                continue
            seqs = ([req] * len(st.token_ids) if st.num_drafts or len(st.token_ids) == 1
                    else self._fan_out(req, update))
            for i, (seq, tok) in enumerate(zip(seqs, st.token_ids, strict=True)):
                seq.append_token(tok, None if st.logprobs is None else st.logprobs[i], now)
                update.appended[seq] = update.appended.get(seq, 0) + 1
                if (stop := stop_status(seq, tok, self.max_model_len)) is not None:
                    self.finish_request(seq, stop[0])
                    seq.stop_reason = stop[1]
                    if st.num_drafts:
                        break  # a stop inside the accepted run: the rest is dropped
            if st.num_drafts:
                self._commit_drafts(req, st.num_accepted)
        return update

    def _commit_drafts(self, req: Request, num_accepted: int) -> None:
        """The accepted drafts' KV is valid (the sampled token's is not computed yet); the
        slots of the rejected ones go back to the pool::

            position   4  5  6  7 | 8  9  10 11 | 12    7: last token, 8..12: drafts d0..d4
            after      computed   | d0 e        |       d0 accepted, e sampled at 9
            blocks     [   b1    ]  [    b2     ]  [b3]  b3 holds only rejected slots: freed
        """
        req.draft_token_ids = []
        if req.is_finished:
            return
        req.num_computed_tokens += num_accepted
        self.block_manager.trim_slots(req, req.num_tokens)
        self.block_manager.cache_full_blocks(req)

    def _fan_out(self, parent: Request, update: StepUpdate) -> list[Request]:
        """Fork a just-prefilled n > 1 request into n running sequences sharing its blocks."""
        parent.forked = True
        children = [parent]
        for i in range(1, parent.sampling_params.n):
            child = parent.fork(f"{parent.group_id}-{i}", i)
            self.block_manager.fork(parent, child)
            self.running.append(child)
            update.forked.append(child)
            children.append(child)
        parent.generators = parent.generators[:1]
        return children

    def apply_stop_strings(self, hits: list[StopStringHit], update: StepUpdate) -> None:
        """Stop each sequence at the token that completed its stop string: later tokens of
        its run are dropped; a stop string overrides a length or grammar stop of that token."""
        for hit in hits:
            req = hit.request
            dropped = req.num_output_tokens - hit.num_output_tokens
            req.truncate_output(hit.num_output_tokens)
            update.appended[req] -= dropped
            if not req.is_finished:
                self.finish_request(req, RequestStatus.FINISHED_STOPPED)
            req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, hit.stop

    def set_draft_tokens(self, drafts: list[tuple[Request, list[int]]]) -> None:
        """The proposer's draft tokens, verified by the next step of each request."""
        for req, tokens in drafts:
            req.draft_token_ids = tokens
