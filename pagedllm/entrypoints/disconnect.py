"""`with_disconnect`: run a route's work, cancelled if the client goes away first (every
generation route uses it, so a client that hangs up never keeps the engine busy)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from contextlib import suppress

from fastapi import Request
from starlette.responses import Response


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def with_disconnect(request: Request, work: Awaitable[Response]) -> Response:
    """Run `work`, cancelling it if the client disconnects first (its cleanup aborts the
    engine requests). A streaming response is returned as soon as it is built; from then on
    the SSE response watches the connection itself."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.cancel()
    if not task.done():
        task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await task
        return Response(status_code=499)  # nobody is listening
    return task.result()
