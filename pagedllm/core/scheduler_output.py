"""The messages of one engine step, all plain data:

    Scheduler.schedule()            -> SchedulerOutput   (what runs, which blocks move)
    ModelRunner.execute(...)        -> RunnerOutput      (core/runner_output.py)
    Scheduler.update_from_output()  -> StepUpdate        (what the step did to the requests)
    OutputProcessor.process(...)    -> StopStringHits + the requests to abort
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedllm.core.request import Request


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int  # query tokens this step, draft tokens included
    # Speculative decoding: the last `num_draft_tokens` query tokens are the request's first
    # draft tokens (`request.draft_token_ids`); their KV counts as computed only once accepted.
    num_draft_tokens: int = 0

    @property
    def samples(self) -> bool:
        """True when this step computes the request's last known token, so it samples."""
        req = self.request
        return (req.num_computed_tokens + self.num_new_tokens
                == req.num_tokens + self.num_draft_tokens)


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
    # Decode steps the runner runs (core/multi_step.py): > 1 only for a batch of greedy
    # decodes whose blocks already cover every step.
    num_steps: int = 1

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        """Nothing to run and no blocks to move (a step whose requests were all swapped out
        still has its swap-outs to execute)."""
        return not (self.scheduled or self.blocks_to_swap_out or self.blocks_to_swap_in
                    or self.blocks_to_copy)


@dataclass
class StepUpdate:
    """What `Scheduler.update_from_output` did to the requests: the output processor
    detokenizes exactly these tokens and the stats count them."""

    appended: dict[Request, int] = field(default_factory=dict)  # sequence -> tokens appended
    forked: list[Request] = field(default_factory=list)  # n > 1 siblings born this step
    errors: dict[str, str] = field(default_factory=dict)  # group id -> why it failed
    pooled: list[Request] = field(default_factory=list)  # pooling requests finished

    @property
    def num_tokens(self) -> int:
        return sum(self.appended.values())


@dataclass
class StopStringHit:
    """A stop string completed by a sequence's token: it keeps its first `num_output_tokens`
    output tokens (later ones of a speculative run are dropped) and stops there."""

    request: Request
    stop: str
    num_output_tokens: int
