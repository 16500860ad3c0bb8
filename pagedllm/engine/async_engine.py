"""AsyncEngine: runs `LLMEngine.step()` in a background thread and hands each request's outputs
to the asyncio side without ever waiting on a consumer.

    HTTP handlers (event loop thread)             engine thread
    ---------------------------------             -------------
    add_requests() ──("add", ...)──▶ command queue ──▶ drained before every step
    RequestStream.abort() ──("abort", ids)──▶           engine.add_request / abort_request
                                                        engine.step(stream=True)
    RequestStream  ◀── loop.call_soon_threadsafe(_dispatch, outputs) ── once per step

The engine is not thread-safe, so only the engine thread touches it; everything the HTTP side
needs (add results, outputs) crosses over as messages; /metrics reads the engine's stats.

Faults: an error in one request's output processing fails only that request (its output
carries `error`); an exception from a whole step aborts the requests in flight and the loop
goes on; if the thread itself dies, `_on_death` (on the event loop) fails every stream and
every queued add at once, new adds raise `EngineDead`, and `wait_dead()` returns (the server
awaits it to exit);
an `EngineFatalError` from a step (a tensor-parallel worker or DP replica gone) or from the
idle `check_health` poll does the same. `_dispatch` runs on
the event loop and merges outputs into each stream's pending slot (deltas concatenated,
cumulative fields replaced), so a reader that falls behind gets one coalesced output when it
catches up: the engine never blocks on it and memory stays O(its tokens), not O(steps).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pagedllm.engine.admission import EngineOverloaded, QueueLimits
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.metrics import ServingMetrics
from pagedllm.engine.request_stream import EngineRequest, RequestAborted, RequestStream
from pagedllm.engine.stats import EngineStats
from pagedllm.errors import EngineError, EngineFatalError, InvalidRequestError
from pagedllm.outputs import RequestOutput

__all__ = ["AsyncEngine", "DuplicateRequestId", "EngineDead", "EngineOverloaded", "EngineRequest",
           "EngineShuttingDown", "QueueLimits", "RequestAborted", "RequestFailed",
           "RequestStream"]
logger = logging.getLogger(__name__)

_IDLE_POLL_S = 0.005  # wait when requests exist but nothing could be scheduled
_HEALTH_POLL_S = 1.0  # while idle, check this often that the engine's workers are alive


ADD_SLICE = 256  # requests of one API call added between two engine steps


@dataclass
class AddJob:
    """One API call's requests being added, `next` the first not yet added."""

    requests: list[EngineRequest]
    fut: asyncio.Future
    added: list[str] = field(default_factory=list)
    next: int = 0


class EngineShuttingDown(EngineError):
    """The engine no longer accepts requests (shutdown started)."""


class EngineDead(EngineError):
    """The engine thread died: nothing in flight will finish and nothing new is accepted."""


class DuplicateRequestId(InvalidRequestError):
    """A request id (e.g. from X-Request-Id) equals one still in flight."""


class RequestFailed(EngineError):
    """The engine hit an error while handling this request (others are unaffected)."""


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
        self._live: set[str] = set()  # engine thread side only
        self._adding: deque[AddJob] = deque()  # engine thread side: calls being added
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
        self._thread = threading.Thread(target=self._run, name="pagedllm-engine", daemon=True)
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

    # ------------------------------------------------------- engine thread
    def _run(self) -> None:
        try:
            self._loop_forever()
        except BaseException as exc:  # last resort: fail everything, let the server exit
            logger.critical("engine thread died: %r", exc, exc_info=exc)
            self._call(self._on_death, exc)

    def _on_death(self, exc: BaseException) -> None:
        """On the event loop (where adds are checked and streams live, so no add can slip
        between the check and this): fail every stream and every add still queued."""
        self.dead = exc
        error = EngineDead(f"engine is dead: {exc!r}")
        self._dispatch_error(list(self._streams), error)
        for job in self._adding:  # the thread is gone: nothing else touches these now
            self._resolve(job.fut, error)
        self._adding.clear()
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
            if cmd[0] == "add":
                self._resolve(cmd[2], error)
        self._died.set()

    async def wait_dead(self) -> BaseException:
        """Return once the engine thread has died (on the loop `start` ran on): its error."""
        await self._died.wait()
        return self.dead

    def _call(self, fn, *args) -> None:
        assert self._loop is not None
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)

    def _loop_forever(self) -> None:
        eng = self.engine
        while True:
            busy = eng.has_unfinished_requests() or bool(self._adding)
            if not self._drain(block=not busy, timeout=None if busy else _HEALTH_POLL_S):
                return
            self._add_slice()
            if not eng.has_unfinished_requests():
                if busy:  # aborts (client hang-ups) emptied it: the same idle check
                    self._check_idle()
                eng.check_health()  # EngineFatalError ends the thread (_run)
                continue
            steps = eng.stats.num_steps
            try:
                outputs = eng.step(stream=True)
            except EngineFatalError:
                raise
            except Exception as exc:
                logger.exception("engine step failed; aborting %d requests", len(self._live))
                self._abort_live(exc)
                continue
            now = time.monotonic()
            for out in outputs:
                if out.finished:
                    self._live.discard(out.request_id)
            if not eng.has_unfinished_requests():
                self._check_idle()
            if outputs:
                self._call(self._dispatch, outputs, now)
            elif eng.stats.num_steps == steps and not self._drain(block=True,
                                                                   timeout=_IDLE_POLL_S):
                return

    def _check_idle(self) -> None:
        """Whenever the engine runs dry: block accounting intact, nothing left in use (a leak
        shows as a violation in /metrics long before the pool runs out)."""
        st = self.engine.stats
        st.invariant_checks_total += 1
        try:
            self.engine.check_idle()
        except Exception:  # noqa: BLE001 - report, keep serving
            st.invariant_violations_total += 1
            logger.exception("engine invariant violated while idle")

    def _drain(self, block: bool, timeout: float | None = None) -> bool:
        """Run queued commands (waiting for the first one if `block`); False on "stop"."""
        try:
            cmd = self._commands.get(timeout=timeout) if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if not self._execute(cmd):
                return False
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
        return True

    def _execute(self, cmd: tuple) -> bool:
        kind = cmd[0]
        if kind == "add":
            self._add(cmd[1], cmd[2])
        elif kind == "abort":
            self._cancel_adds(set(cmd[1]), None)
            ids = [rid for rid in cmd[1] if rid in self._live]
            self.engine.abort_request(ids)
            self._live.difference_update(ids)
        elif kind == "abort_all":
            self._cancel_adds(set(), EngineShuttingDown("server is shutting down"))
            self._abort_live(RequestAborted("request aborted: server is shutting down"))
        elif kind == "stop":
            return False
        return True

    def _add(self, requests: list[EngineRequest], fut: asyncio.Future) -> None:
        """Start adding one API call's requests: admission is checked for all of them now,
        the adding itself goes ADD_SLICE requests per engine step (`_add_slice`)."""
        if self.shutting_down:
            self._call(self._resolve, fut, EngineShuttingDown("server is shutting down"))
            return
        try:
            self.limits.check(self.engine.scheduler, [self._prompt_len(r) for r in requests])
        except Exception as exc:  # EngineOverloaded, RequestNeverAdmittable
            self._call(self._resolve, fut, exc)
            return
        self._adding.append(AddJob(requests, fut))

    def _add_slice(self) -> None:
        """Add the next ADD_SLICE requests of the oldest pending call (a 20,000-prompt call
        must not keep every other request from stepping); resolve the call once all its
        requests are in, or abort those added and fail it on the first invalid one."""
        if not self._adding:
            return
        job = self._adding[0]
        try:
            for r in job.requests[job.next:job.next + ADD_SLICE]:
                kwargs = {"priority": r.priority} if r.priority else {}
                self.engine.add_request(r.prompt, r.params, request_id=r.request_id,
                                        arrival_time=r.arrival_time, cache_salt=r.cache_salt,
                                        lora_request=r.lora_request, **kwargs)
                job.added.append(r.request_id)
                self._live.add(r.request_id)
        except Exception as exc:  # ValueError for bad input; anything else is ours
            self._adding.popleft()
            self._drop(job.added)
            self._call(self._resolve, job.fut, exc)
            return
        job.next += ADD_SLICE
        if job.next >= len(job.requests):
            self._adding.popleft()
            self._call(self._resolve, job.fut, None)

    def _drop(self, request_ids: list[str]) -> None:
        self.engine.abort_request(request_ids)
        self._live.difference_update(request_ids)

    def _cancel_adds(self, request_ids: set[str], error: BaseException | None) -> None:
        """Pending calls holding any of these ids (their client left, or shutdown) are
        dropped with what they had added."""
        for job in [j for j in self._adding if error is not None or
                    not request_ids.isdisjoint(r.request_id for r in j.requests)]:
            self._adding.remove(job)
            self._drop(job.added)
            if error is not None:
                self._call(self._resolve, job.fut, error)

    def _prompt_len(self, r: EngineRequest) -> int:
        if self.limits.max_num_queued_tokens is None or not isinstance(r.prompt, str):
            return len(r.prompt)
        return len(self.engine.tokenizer.encode(r.prompt))

    def _abort_live(self, error: BaseException) -> None:
        ids = list(self._live)
        self._live.clear()
        try:
            self.engine.abort_request(ids)
        except Exception:
            logger.exception("abort after failure failed")
        self._call(self._dispatch_error, ids, error)

