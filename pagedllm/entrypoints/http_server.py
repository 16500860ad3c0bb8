"""Running the app under uvicorn: connection timeouts and a graceful shutdown.

Connections: uvicorn's keep-alive timeout covers the idle time between requests, but nothing
bounds the time to send the request headers (a client trickling one header line every few
seconds, or connecting and sending nothing, held a connection forever). `timed_h11` adds that
deadline: armed when a connection opens and after each response, disarmed once the headers
are complete; it closes the connection. The body deadline is the body-limit middleware's,
the connection cap uvicorn's `limit_concurrency`.

Shutdown (SIGTERM / SIGINT), as serving systems do it::

    signal 1 ── stop accepting: new requests and /health get 503 + Retry-After
        │       (the listener stays open so clients are told, not refused)
        ├── in-flight requests finish ........ up to --shutdown-timeout seconds
        ├── the rest are aborted: streams end with an error event, others get 503
        └── uvicorn closes the connections; the process exits 0
    signal 2 ── exit at once
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from pagedllm.engine.async_engine import AsyncEngine

logger = logging.getLogger(__name__)

_DRAIN_POLL_S = 0.05
_DEAD_EXIT_DELAY_S = 1.0  # after the engine died: time for the failed responses to go out
_FLUSH_S = 0.5  # after the abort: time for the error events to reach the clients


def timed_h11(header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a deadline for the request headers."""

    class TimedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the headers are in
                self._disarm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
                self._arm_header_timer()

        def connection_lost(self, exc) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(header_timeout, self._header_timeout)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                logger.info("closing a connection: no complete request headers within %g s",
                            header_timeout)
                self.transport.close()

    return TimedH11Protocol


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the shutdown sketched in the module docstring."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine,
                 shutdown_timeout: float) -> None:
        super().__init__(config)
        self.engine, self.shutdown_timeout = engine, shutdown_timeout
        self.draining = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task | None = None
        self._watch_task: asyncio.Task | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)  # the app's lifespan starts the engine
        self._watch_task = asyncio.ensure_future(self._exit_when_engine_dies())

    async def _exit_when_engine_dies(self) -> None:
        exc = await self.engine.wait_dead()
        logger.critical("engine died (%r): shutting the server down", exc)
        # A moment for the failed responses to go out and /health to answer 503.
        await asyncio.sleep(_DEAD_EXIT_DELAY_S)
        self.should_exit = True

    def handle_exit(self, sig: int, frame) -> None:
        if self.draining or self._loop is None or self.shutdown_timeout == 0:
            if self.draining:
                logger.info("signal %d again: exiting now", sig)
                self.force_exit = True
            else:
                logger.info("signal %d: shutting down, aborting in-flight requests", sig)
            self.engine.begin_shutdown()
            super().handle_exit(sig, frame)
            return
        self.draining = True
        self.engine.stop_accepting()
        logger.info("signal %d: refusing new requests, letting %d in flight finish (up to "
                    "%g s; a second signal exits now)", sig, self.engine.num_in_flight,
                    self.shutdown_timeout)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.shutdown_timeout
        while self.engine.num_in_flight and time.monotonic() < deadline:
            await asyncio.sleep(_DRAIN_POLL_S)
        if self.engine.num_in_flight:
            logger.warning("shutdown: aborting %d requests still in flight after %g s",
                           self.engine.num_in_flight, self.shutdown_timeout)
            self.engine.begin_shutdown()
            await asyncio.sleep(_FLUSH_S)
        self.should_exit = True


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the listening socket (before the model loads, so a busy port fails fast);
    OSError says which address is taken."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock
