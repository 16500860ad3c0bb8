"""The engine thread of an `AsyncEngine` (engine/async_engine.py): the only thread that touches
the `LLMEngine`. It drains the command queue the event loop fills ("add", "abort",
"abort_all", "stop"), adds each API call's requests ADD_SLICE at a time between steps, steps,
and hands every step's outputs back to the event loop; results and errors cross over only
through the callbacks it was constructed with (run on the loop via `on_loop`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pagedllm.engine.admission import QueueLimits
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.request_stream import EngineRequest, EngineShuttingDown, RequestAborted
from pagedllm.errors import EngineFatalError

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


class EngineThread:
    def __init__(self, engine: LLMEngine, limits: QueueLimits, commands: queue.SimpleQueue,
                 *, accepting: Callable[[], bool], on_loop: Callable, dispatch: Callable,
                 dispatch_error: Callable, resolve: Callable,
                 on_death: Callable[[BaseException], None]) -> None:
        """`on_loop(fn, *args)` runs `fn` on the event loop; `dispatch(outputs, now)`,
        `dispatch_error(request_ids, error)`, `resolve(future, error)` and `on_death(exc)`
        are the event loop's handlers; `accepting()` is False once shutdown began."""
        self.engine = engine
        self.limits = limits
        self._commands = commands
        self._accepting = accepting
        self._on_loop, self._dispatch, self._dispatch_error = on_loop, dispatch, dispatch_error
        self._resolve, self._on_death = resolve, on_death
        self._live: set[str] = set()  # requests in the engine
        self._adding: deque[AddJob] = deque()  # calls being added

    def run(self) -> None:
        """The thread's body; if it dies, `on_death` fails everything (on the loop)."""
        try:
            self._loop_forever()
        except BaseException as exc:  # last resort: fail everything, let the server exit
            logger.critical("engine thread died: %r", exc, exc_info=exc)
            self._on_loop(self._on_death, exc)

    def take_pending_adds(self) -> list[asyncio.Future]:
        """After the thread died: the futures of every add it had not finished (calls being
        added and "add" commands still queued), for the loop to fail."""
        futures = [job.fut for job in self._adding]
        self._adding.clear()
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return futures
            if cmd[0] == "add":
                futures.append(cmd[2])

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
                self._on_loop(self._dispatch, outputs, now)
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
        if not self._accepting():
            self._on_loop(self._resolve, fut, EngineShuttingDown("server is shutting down"))
            return
        try:
            self.limits.check(self.engine.scheduler, [self._prompt_len(r) for r in requests])
        except Exception as exc:  # EngineOverloaded, RequestNeverAdmittable
            self._on_loop(self._resolve, fut, exc)
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
            self._on_loop(self._resolve, job.fut, exc)
            return
        job.next += ADD_SLICE
        if job.next >= len(job.requests):
            self._adding.popleft()
            self._on_loop(self._resolve, job.fut, None)

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
                self._on_loop(self._resolve, job.fut, error)

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
        self._on_loop(self._dispatch_error, ids, error)

