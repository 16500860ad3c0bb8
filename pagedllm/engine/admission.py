"""Admission control for the server: bounded waiting queue (vLLM's --max-num-queued-reqs and
--max-num-queued-tokens). Past a limit a new API call is refused with `EngineOverloaded`
(HTTP 429 with Retry-After); nothing already admitted is disturbed.

The check runs on the engine thread when the "add" command is executed, against the
scheduler's waiting queue at that moment, so it is exact (no stale snapshot) and all-or-nothing
for the requests of one API call.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedllm.core.scheduler import Scheduler
from pagedllm.errors import EngineError, InvalidRequestError


class EngineOverloaded(EngineError):
    """The waiting queue is full; retry after `retry_after` seconds. `reason` labels the
    rejection metric ("queued_reqs" or "queued_tokens")."""

    def __init__(self, message: str, reason: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.reason, self.retry_after = reason, retry_after


class RequestNeverAdmittable(InvalidRequestError):
    """The call brings more prompts or tokens than the waiting queue may ever hold: retrying
    cannot help (HTTP 400 naming the limit, not 429)."""


@dataclass
class QueueLimits:
    """None means unbounded (the default, as in vLLM)."""

    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_num_queued_reqs", "max_num_queued_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")

    @property
    def unbounded(self) -> bool:
        return self.max_num_queued_reqs is None and self.max_num_queued_tokens is None

    def check(self, scheduler: Scheduler, prompt_lens: list[int]) -> None:
        """Raise EngineOverloaded if queueing requests with these prompt lengths would pass a
        limit. Waiting sequences of one n > 1 request count once, as in the waiting gauge."""
        if self.unbounded:
            return
        if self.max_num_queued_reqs is not None and len(prompt_lens) > self.max_num_queued_reqs:
            raise RequestNeverAdmittable(
                f"this request brings {len(prompt_lens)} prompts and at most "
                f"{self.max_num_queued_reqs} may wait at once (--max-num-queued-reqs): it can "
                "never be admitted; send fewer prompts per request")
        if (self.max_num_queued_tokens is not None
                and sum(prompt_lens) > self.max_num_queued_tokens):
            raise RequestNeverAdmittable(
                f"this request brings {sum(prompt_lens)} prompt tokens and at most "
                f"{self.max_num_queued_tokens} may wait at once (--max-num-queued-tokens): it "
                "can never be admitted; send fewer or shorter prompts per request")
        waiting = scheduler.waiting
        if self.max_num_queued_reqs is not None:
            queued = waiting.num_groups
            if queued + len(prompt_lens) > self.max_num_queued_reqs:
                raise EngineOverloaded(
                    f"server overloaded: {queued} requests are waiting, the limit is "
                    f"{self.max_num_queued_reqs} (--max-num-queued-reqs); retry later",
                    "queued_reqs")
        if self.max_num_queued_tokens is not None:
            tokens = sum(r.num_tokens - r.num_computed_tokens for r in waiting)
            if tokens + sum(prompt_lens) > self.max_num_queued_tokens:
                raise EngineOverloaded(
                    f"server overloaded: {tokens} prompt tokens are waiting and this request "
                    f"brings {sum(prompt_lens)}, the limit is {self.max_num_queued_tokens} "
                    "(--max-num-queued-tokens); retry later", "queued_tokens")
