"""The asyncio side of one API call's engine requests: `RequestStream` and its coalescing.

The engine thread's outputs reach a stream through `AsyncEngine._dispatch` on the event loop;
`put` merges each into the request's pending slot (deltas concatenated, cumulative fields
replaced), so a reader that falls behind gets one coalesced output when it catches up: the
engine never blocks on it and memory stays O(its tokens), not O(steps).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from pagedllm.errors import EngineError, InvalidRequestError
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import RequestOutput
from pagedllm.sampling_params import SamplingParams


class RequestAborted(EngineError):
    """The engine aborted the request (shutdown) before it finished."""


class EngineShuttingDown(EngineError):
    """The engine no longer accepts requests (shutdown started)."""


class EngineDead(EngineError):
    """The engine thread died: nothing in flight will finish and nothing new is accepted."""


class DuplicateRequestId(InvalidRequestError):
    """A request id (e.g. from X-Request-Id) equals one still in flight."""


class RequestFailed(EngineError):
    """The engine hit an error while handling this request (others are unaffected)."""


@dataclass
class EngineRequest:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    cache_salt: str | None = None  # prefix-cache namespace (tenant isolation)
    lora_request: LoRARequest | None = None  # the adapter to run with (None: base model)
    priority: int = 0  # --scheduling-policy priority: lower runs earlier


def _merge(into: RequestOutput, new: RequestOutput) -> None:
    """Fold `new` (a later output of the same request) into `into`, in place: deltas are
    appended (token and logprob lists extended, not copied), cumulative fields replaced."""
    by_index = {c.index: c for c in into.outputs}
    for c in new.outputs:
        old = by_index.get(c.index)
        if old is None:  # n > 1 fan-out happened since
            by_index[c.index] = c
            continue
        old.delta_text += c.delta_text
        old.delta_token_ids.extend(c.delta_token_ids)
        if old.delta_logprobs is not None and c.delta_logprobs is not None:
            old.delta_logprobs.extend(c.delta_logprobs)
        old.text, old.token_ids, old.logprobs = c.text, c.token_ids, c.logprobs
        old.cumulative_logprob = c.cumulative_logprob
        old.finish_reason, old.stop_reason = c.finish_reason, c.stop_reason
    into.outputs = [by_index[i] for i in sorted(by_index)]
    into.finished, into.metrics = new.finished, new.metrics
    into.num_cached_tokens = new.num_cached_tokens
    if new.prompt_logprobs is not None:  # DELTA: only some outputs carry them
        into.prompt_logprobs = new.prompt_logprobs


class RequestStream:
    """Outputs of the engine requests behind one API call, in arrival order per request.

    Iterate with `async for outputs in stream` (each item: the requests' outputs that arrived
    since the last item, coalesced per request). Iteration ends when all requests finished;
    raises `RequestAborted` if the engine aborted them, or the engine's error. `abort()` (also
    safe after the end) cancels whatever is unfinished.
    """

    def __init__(self, requests: Sequence[EngineRequest],
                 on_close: Callable[[RequestStream, list[str]], None]) -> None:
        """`on_close(stream, unfinished request ids)`: the consumer is done with the stream;
        the engine aborts the unfinished requests and forgets the stream."""
        self._on_close = on_close
        self.request_ids = [r.request_id for r in requests]
        self._arrival = {r.request_id: r.arrival_time for r in requests}
        self._unfinished = set(self.request_ids)
        self._pending: dict[str, RequestOutput] = {}
        self._error: BaseException | None = None
        self._event = asyncio.Event()

    @property
    def finished(self) -> bool:
        return not self._unfinished

    def arrival_time(self, request_id: str) -> float:
        return self._arrival[request_id]

    # -- called on the event loop by the engine's dispatch
    def put(self, out: RequestOutput) -> None:
        prev = self._pending.get(out.request_id)
        if prev is None:
            self._pending[out.request_id] = out
        else:
            _merge(prev, out)
        if out.finished:
            self._unfinished.discard(out.request_id)
        self._event.set()

    def fail(self, error: BaseException, request_id: str) -> None:
        """`request_id` ended with `error`: iteration raises it; the call's other requests
        stay unfinished so that `abort()` (the consumer's cleanup) cancels them."""
        self._error = error
        self._unfinished.discard(request_id)
        self._event.set()

    # -- consumer side
    async def __aiter__(self) -> AsyncIterator[list[RequestOutput]]:
        while True:
            if self._pending:
                outs = [self._pending.pop(r) for r in self.request_ids if r in self._pending]
                yield outs
                continue
            if self._error is not None:
                raise self._error
            if not self._unfinished:
                return
            self._event.clear()
            await self._event.wait()

    def rejected(self) -> None:
        """The engine refused the call's requests: nothing was queued, nothing to abort."""
        self._unfinished.clear()

    def abort(self) -> None:
        unfinished, self._unfinished = list(self._unfinished), set()
        self._on_close(self, unfinished)
