"""Errors of the Anthropic routes in Anthropic's shape:
{"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}.

Every error of /v1/messages* is made in OpenAI's shape by the code that refuses the request
(the guard's 401 / 415, the body limit's 408 / 413, validation's 400, a route's APIError, ...);
`AnthropicErrorShape`, the outermost middleware, rewrites those bodies for these paths, so no
refusal can slip out in the other API's shape (an unhandled exception is answered here as
a 500 `api_error`). Status codes stay as they are.
"""

from __future__ import annotations

import json
import logging

# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
# In-band stream errors carry the OpenAI type only.
_TYPE_BY_OPENAI_TYPE = {
    "service_unavailable": "overloaded_error",
    "server_error": "api_error",
    "rate_limit_error": "rate_limit_error",
}

MESSAGES_PATH = "/v1/messages"
logger = logging.getLogger(__name__)


def error_type(status: int) -> str:
    default = "api_error" if status >= 500 else "invalid_request_error"
    return _TYPE_BY_STATUS.get(status, default)


def error_body(kind: str, message: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


def stream_error_body(openai_error: dict) -> dict:
    """The chat stream's in-band error as Anthropic's `error` event payload."""
    kind = _TYPE_BY_OPENAI_TYPE.get(openai_error.get("type", ""), "api_error")
    return error_body(kind, str(openai_error.get("message", "")))


def reshape(status: int, body: bytes) -> bytes:
    """An OpenAI-shaped error body as Anthropic's (anything else unchanged)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body
    err = data.get("error") if isinstance(data, dict) else None
    if not isinstance(err, dict) or "message" not in err:
        return body
    return json.dumps(error_body(error_type(status), str(err["message"]))).encode()


def is_messages_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


class AnthropicErrorShape:
    """ASGI middleware: error responses (status >= 400) of /v1/messages* in Anthropic's
    shape. Other paths and successful responses (streams included) pass untouched."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not is_messages_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        start: dict | None = None
        chunks: list[bytes] = []

        async def reshaping(message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = reshape(start["status"], b"".join(chunks))
            headers = [
                (k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"
            ]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        sent = False

        async def tracking(message) -> None:
            nonlocal sent
            sent = sent or message["type"] == "http.response.start"
            await reshaping(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception as exc:
            # The app's catch-all handler sits outside every middleware (Starlette's
            # ServerErrorMiddleware): answer here, so that a 500 has this API's shape too.
            if sent:
                raise
            logger.exception("unhandled error")
            body = json.dumps(error_body("api_error", f"internal error: {exc}")).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
