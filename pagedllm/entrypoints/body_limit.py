"""Refuse request bodies over `--max-request-body-bytes` before anything parses them.

Pure ASGI: a Content-Length over the limit is answered 413 without reading the body; a body
without one (chunked) is read up to the limit, then either refused or replayed to the app
(messages after the body, such as a disconnect, pass through unchanged).
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.responses import JSONResponse

from pagedllm.entrypoints.serving import APIError

DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 2**20


class BodyLimitMiddleware:
    def __init__(self, app, max_bytes: int, on_reject: Callable[[], None] | None = None
                 ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_request_body_bytes must be >= 1, got {max_bytes}")
        self.app, self.max_bytes, self.on_reject = app, max_bytes, on_reject

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
            await self.app(scope, receive, send)
            return
        buffered, size = [], 0
        while True:
            message = await receive()
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
