"""AsyncEngine: runs `LLMEngine.step()` in a background thread and hands each request's outputs
to the asyncio side without ever waiting on a consumer.

    HTTP handlers (event loop thread)             engine thread
    ---------------------------------             -------------
    add_requests() ──("add", ...)──▶ command queue ──▶ drained before every step
    RequestStream.abort() ──("abort", ids)──▶           engine.add_request / abort_request
                                                        engine.step(stream=True)
    RequestStream  ◀── loop.call_soon_threadsafe(_dispatch, outputs) ── once per step

The engine is not thread-safe, so only the engine thread (engine/engine_thread.py) touches it;
everything the HTTP side needs (add results, outputs) crosses over as messages; /metrics reads
the engine's stats.

Faults: an error in one request's output processing fails only that request (its output
carries `error`); an exception from a whole step aborts the requests in flight and the loop
goes on; if the thread itself dies, `_on_death` (on the event loop) fails every stream and
every queued add at once, new adds raise `EngineDead`, and `wait_dead()` returns (the server
awaits it to exit); an `EngineFatalError` from a step (a tensor-parallel worker or DP replica
gone) or from the idle `check_health` poll does the same. `_dispatch` runs on the event loop
and merges outputs into each stream's pending slot (deltas concatenated,
cumulative fields replaced), so a reader that falls behind gets one coalesced output when it
catches up: the engine never blocks on it and memory stays O(its tokens), not O(steps).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Sequence

from pagedllm.engine.admission import EngineOverloaded, QueueLimits
from pagedllm.engine.engine_thread import EngineThread
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.metrics import ServingMetrics
from pagedllm.engine.request_stream import (
    DuplicateRequestId,
    EngineDead,
    EngineRequest,
    EngineShuttingDown,
    RequestAborted,
    RequestFailed,
    RequestStream,
)
from pagedllm.engine.stats import EngineStats
from pagedllm.outputs import RequestOutput

__all__ = ["AsyncEngine", "DuplicateRequestId", "EngineDead", "EngineOverloaded", "EngineRequest",
           "EngineShuttingDown", "QueueLimits", "RequestAborted", "RequestFailed",
           "RequestStream"]
logger = logging.getLogger(__name__)

class AsyncEngine:
    """Owns an `LLMEngine` and the thread that steps it; see the module docstring."""

    def __init__(self, engine: LLMEngine, served_model_name: str | None = None,
                 limits: QueueLimits | None = None) -> None:
        self.engine = engine
        self.limits = limits or QueueLimits()
        self.model_name = served_model_name or engine.model_name
        self.metrics = ServingMetrics(self.model_name, lambda: self.engine.stats)
        self.shutting_down = False
        self.dead: BaseException | None = None  # set (on the event loop) if the thread died
        self._commands: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}  # event loop side only
        self._worker = EngineThread(
            engine, self.limits, self._commands, accepting=lambda: not self.shutting_down,
            on_loop=self._call, dispatch=self._dispatch, dispatch_error=self._dispatch_error,
            resolve=self._resolve, on_death=self._on_death)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def snapshot(self) -> EngineStats:
        """The engine's counters and gauges (kept current by the engine thread)."""
        return self.engine.stats

    # ------------------------------------------------------------ lifecycle
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._died = asyncio.Event()
        self._thread = threading.Thread(target=self._worker.run, name="pagedllm-engine",
                                        daemon=True)
        self._thread.start()

    def stop_accepting(self) -> None:
        """New requests are refused (EngineShuttingDown); those in flight go on."""
        self.shutting_down = True

    def begin_shutdown(self) -> None:
        """Stop accepting requests and abort those in flight (thread- and signal-safe)."""
        self.shutting_down = True
        self._commands.put(("abort_all",))

    @property
    def num_in_flight(self) -> int:
        """Engine requests whose outputs someone still waits for (event loop side)."""
        return len(self._streams)

    def stop(self, timeout: float = 30.0) -> None:
        """Abort everything, then stop and join the engine thread."""
        self.begin_shutdown()
        self._commands.put(("stop",))
        if self._thread is not None:
            self._thread.join(timeout)

    # ------------------------------------------------------------ requests
    async def add_requests(self, requests: Sequence[EngineRequest]) -> RequestStream:
        """Queue all requests or none; raises ValueError (invalid input) or EngineShuttingDown."""
        if self.shutting_down:
            raise EngineShuttingDown("server is shutting down")
        if self.dead is not None:
            raise EngineDead(f"engine is dead: {self.dead!r}")
        stream = RequestStream(requests, on_close=self._close_stream)
        taken = next((rid for rid in stream.request_ids if rid in self._streams), None)
        if taken is not None or len(set(stream.request_ids)) != len(stream.request_ids):
            raise DuplicateRequestId(f"request id {taken!r} is already in use by a request "
                                     "in flight (ids must be unique)")
        for rid in stream.request_ids:
            self._streams[rid] = stream
        fut = asyncio.get_running_loop().create_future()
        self._commands.put(("add", list(requests), fut))
        try:
            await fut
        except asyncio.CancelledError:
            # The client left while the add was queued: commands are FIFO, so this abort
            # follows the add and frees whatever it queued.
            stream.abort()
            raise
        except BaseException as exc:
            stream.rejected()
            self._streams_closed(stream)
            if isinstance(exc, EngineOverloaded):
                self.metrics.observe_rejected(exc.reason)
            raise
        return stream

    def _close_stream(self, stream: RequestStream, unfinished: list[str]) -> None:
        """A consumer is done with `stream`: abort its unfinished requests, forget it."""
        if unfinished:
            now = time.monotonic()
            for rid in unfinished:
                self.metrics.observe_abort(rid, stream.arrival_time(rid), now)
            self._commands.put(("abort", unfinished))
        self._streams_closed(stream)

    def _streams_closed(self, stream: RequestStream) -> None:
        for rid in stream.request_ids:
            if self._streams.get(rid) is stream:
                del self._streams[rid]

    # ------------------------------------------- event loop side of dispatch
    def _dispatch(self, outputs: list[RequestOutput], now: float) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # its consumer already left (abort queued)
            if out.error is not None:
                self._dispatch_error([out.request_id], RequestFailed(
                    f"request {out.request_id} failed in the engine: {out.error}"))
                continue
            self.metrics.observe(out, now)
            stream.put(out)
            if out.finished:
                del self._streams[out.request_id]

    def _dispatch_error(self, request_ids: list[str], error: BaseException) -> None:
        now = time.monotonic()
        for rid in request_ids:
            stream = self._streams.pop(rid, None)
            if stream is not None:
                self.metrics.observe_abort(rid, stream.arrival_time(rid), now)
                stream.fail(error, rid)

    @staticmethod
    def _resolve(fut: asyncio.Future, error: BaseException | None) -> None:
        if fut.done():
            return
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)

    # ------------------------------------------------------------ engine death
    def _on_death(self, exc: BaseException) -> None:
        """On the event loop (where adds are checked and streams live, so no add can slip
        between the check and this): fail every stream and every add still queued."""
        self.dead = exc
        error = EngineDead(f"engine is dead: {exc!r}")
        self._dispatch_error(list(self._streams), error)
        for fut in self._worker.take_pending_adds():  # the thread is gone: they are ours
            self._resolve(fut, error)
        self._died.set()

    async def wait_dead(self) -> BaseException:
        """Return once the engine thread has died (on the loop `start` ran on): its error."""
        await self._died.wait()
        return self.dead

    def _call(self, fn, *args) -> None:
        """Run `fn(*args)` on the event loop (from the engine thread)."""
        assert self._loop is not None
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)
