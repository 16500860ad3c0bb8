"""`GuardMiddleware`: what is refused before a route runs, in this order:

1. a Host header not in --allowed-hosts (400; DNS rebinding: a web page whose name now
   resolves to 127.0.0.1 sends its own Host);
2. anything but /metrics and /version once shutdown began (503 + Retry-After; /health too, so
   load balancers stop sending);
3. a POST to a JSON route whose Content-Type is not JSON (415: a browser sends a cross-site
   form POST as
   text/plain without a CORS preflight, JSON needs one; other paths keep their 404 / 405);
4. /v1/*, /tokenize and /detokenize without the API key (401): `Authorization: Bearer <key>`
   (OpenAI's clients) or `x-api-key: <key>` (Anthropic's).

Every response echoes the client's X-Request-Id header, errors included.

Pure ASGI, so streaming and disconnect detection are untouched.
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse

from pagedllm.engine.async_engine import AsyncEngine
from pagedllm.entrypoints.errors import APIError

PROTECTED = ("/v1/", "/tokenize", "/detokenize")
OPEN_WHILE_SHUTTING_DOWN = ("/metrics", "/version")
JSON_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
                         "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/messages",
                         "/v1/messages/count_tokens", "/v1/responses"})
SHUTDOWN_RETRY_AFTER_S = 5


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def host_name(host: bytes) -> str:
    """The name part of a Host header value: 'Example.com:8000' -> 'example.com',
    '[::1]:8000' -> '::1'."""
    text = host.decode("latin-1").strip().lower()
    if text.startswith("["):
        return text[1:text.find("]")] if "]" in text else text
    return text.rsplit(":", 1)[0] if text.count(":") == 1 else text


def is_json(content_type: bytes) -> bool:
    media = content_type.split(b";", 1)[0].strip().lower()
    return media == b"application/json" or (media.startswith(b"application/")
                                            and media.endswith(b"+json"))


class GuardMiddleware:
    def __init__(self, app, engine: AsyncEngine, api_key: str | None,
                 allowed_hosts: list[str] | None = None) -> None:
        self.app, self.engine = app, engine
        self.api_key = api_key.encode() if api_key else None
        self.allowed_hosts = ({h.lower().strip("[]") for h in allowed_hosts}
                              if allowed_hosts else None)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            err = self._check(scope)
            request_id = dict(scope["headers"]).get(b"x-request-id")
            if request_id is not None:
                send = _echoing(send, request_id)
            if err is not None:
                await error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _check(self, scope) -> APIError | None:
        path, headers = scope["path"], dict(scope["headers"])
        if self.allowed_hosts is not None:
            name = host_name(headers.get(b"host", b""))
            if name not in self.allowed_hosts:
                return APIError(400, f"Host {name[:100]!r} is not allowed (--allowed-hosts)",
                                code="invalid_host")
        if self.engine.shutting_down and not path.startswith(OPEN_WHILE_SHUTTING_DOWN):
            return APIError(503, "server is shutting down", type="service_unavailable",
                            headers={"Retry-After": str(SHUTDOWN_RETRY_AFTER_S)})
        if (scope["method"] == "POST" and path in JSON_ROUTES
                and not is_json(headers.get(b"content-type", b""))):
            got = headers.get(b"content-type", b"").decode("latin-1")[:100] or "none"
            return APIError(415, f"Content-Type must be application/json, got {got!r}",
                            code="unsupported_media_type")
        if self.api_key is not None and path.startswith(PROTECTED):
            auth = headers.get(b"authorization", b"")
            bearer = hmac.compare_digest(auth, b"Bearer " + self.api_key)
            x_api_key = hmac.compare_digest(headers.get(b"x-api-key", b""), self.api_key)
            if not (bearer or x_api_key):
                return APIError(401, "missing or invalid API key (send 'Authorization: "
                                "Bearer <key>' or 'x-api-key: <key>')",
                                type="authentication_error", code="invalid_api_key")
        return None


def _echoing(send, request_id: bytes):
    """`send` that adds the client's X-Request-Id to a response that does not carry one
    (errors too; the generation routes set the id they used)."""
    async def wrapped(message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", []))
            if not any(k.lower() == b"x-request-id" for k, _ in headers):
                headers.append((b"x-request-id", request_id[:256]))
                message = {**message, "headers": headers}
        await send(message)
    return wrapped
