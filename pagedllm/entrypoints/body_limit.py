"""Refuse request bodies over `--max-request-body-bytes`, or not complete within
`--timeout-request-body` seconds, before anything parses them.

Pure ASGI: a Content-Length over the limit is answered 413 without reading the body; any other
body is read here (up to the limit, against the deadline), then either refused (413, or 408
for a body that stopped arriving: a chunked body that never ends, a Content-Length larger
than what is sent) or replayed to the app (messages after the body, such as a disconnect,
pass through unchanged). Refusals close the connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from starlette.responses import JSONResponse

from pagedllm.entrypoints.errors import APIError

DEFAULT_BODY_TIMEOUT_S = 30.0


class BodyLimitMiddleware:
    def __init__(self, app, max_bytes: int, on_reject: Callable[[], None] | None = None,
                 timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_request_body_bytes must be >= 1, got {max_bytes}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_request_body must be > 0, got {timeout_s}")
        self.app, self.max_bytes, self.on_reject = app, max_bytes, on_reject
        self.timeout_s = timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            try:
                too_big = int(length) > self.max_bytes
            except ValueError:
                too_big = False  # let the server's own parsing reject it
            if too_big:
                await self._refuse(scope, receive, send, int(length))
                return
        buffered, size = [], 0
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - time.monotonic())
            except TimeoutError:
                await self._timed_out(scope, receive, send, size)
                return
            if message["type"] != "http.request":
                buffered.append(message)
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(scope, receive, send, None)
                return
            buffered.append(message)
            if not message.get("more_body", False):
                break

        async def replay():
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send, length: int | None) -> None:
        if self.on_reject is not None:
            self.on_reject()
        got = f"{length} bytes" if length is not None else "more than that"
        err = APIError(413, f"request body too large: the limit is {self.max_bytes} bytes "
                       f"(--max-request-body-bytes), got {got}", code="request_too_large")
        await JSONResponse(err.body(), status_code=413,
                           headers={"Connection": "close"})(scope, receive, send)

    async def _timed_out(self, scope, receive, send, size: int) -> None:
        err = APIError(408, f"request body not complete within {self.timeout_s:g} s "
                       f"(--timeout-request-body); {size} bytes arrived",
                       code="request_timeout")
        await JSONResponse(err.body(), status_code=408,
                           headers={"Connection": "close"})(scope, receive, send)
