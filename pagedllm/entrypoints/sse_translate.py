"""Serving another API's stream through the chat route: the chat route's own SSE response
with each of its events rewritten by a `ChunkConverter` (the Anthropic Messages and OpenAI
Responses streams are built this way, as vLLM builds them).

    chat route  --"data: {chunk}\\n\\n"-->  TranslatedSSE  --"event: x\\ndata: {...}\\n\\n"-->

The chat response runs unchanged underneath: it aborts the engine request however the stream
ends (finished, client gone, error), watches the connection and sets X-Request-Id; only the
body bytes pass through the converter.
"""

from __future__ import annotations

import json
from typing import Protocol

from starlette.responses import Response


class ChunkConverter(Protocol):
    """Turns the chat stream's events into the target API's SSE text."""

    def chunk(self, data: dict) -> str:
        """One chat.completion.chunk (usage in every chunk: continuous_usage_stats)."""
        ...

    def error(self, error: dict) -> str:
        """The chat stream's in-band error ({"message", "type", "code", ...})."""
        ...

    def done(self) -> str:
        """The chat stream ended ([DONE])."""
        ...


# One event as /openapi.json declares it for the streaming routes (schemathesis checks each).
SSE_EVENT = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
}


def named_event(event: str, payload: dict) -> str:
    """An SSE event with an `event:` line, as Anthropic and the Responses API send them."""
    return f"event: {event}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


class TranslatedSSE(Response):
    """`inner` (the chat route's SSE response) with its events rewritten by `converter`."""

    def __init__(self, inner: Response, converter: ChunkConverter) -> None:
        self.inner, self.converter = inner, converter
        self.status_code, self.raw_headers = inner.status_code, inner.raw_headers
        self.background = None
        self._pending = ""

    async def __call__(self, scope, receive, send) -> None:
        async def translated(message) -> None:
            if message["type"] == "http.response.body":
                text = self._feed(message.get("body", b"").decode("utf-8"))
                message = {**message, "body": text.encode("utf-8")}
            await send(message)

        await self.inner(scope, receive, translated)

    def _feed(self, text: str) -> str:
        """Whole events of `text` (a partial one waits for the rest) converted."""
        self._pending += text
        *events, self._pending = self._pending.split("\n\n")
        out = []
        for event in events:
            if not event.startswith("data: "):
                continue
            data = event[len("data: ") :]
            if data == "[DONE]":
                out.append(self.converter.done())
                continue
            payload = json.loads(data)
            if "error" in payload and "choices" not in payload:
                out.append(self.converter.error(payload["error"]))
            else:
                out.append(self.converter.chunk(payload))
        return "".join(out)
