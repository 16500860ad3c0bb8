"""The OpenAI-compatible HTTP server: FastAPI app (routes, errors, auth) and `run_server`.

Errors always have OpenAI's shape {"error": {"message", "type", "param", "code"}}: invalid
parameters and schema errors are 400 (not FastAPI's 422), an unknown model 404, a missing or
wrong API key 401, and everything but /metrics and /version is 503 once shutdown began.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
import socket
from collections.abc import Awaitable
from contextlib import asynccontextmanager, suppress

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

import pagedllm
from pagedllm.engine.async_engine import AsyncEngine, EngineDead, RequestFailed
from pagedllm.entrypoints.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES, BodyLimitMiddleware
from pagedllm.entrypoints.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)
from pagedllm.entrypoints.serving import APIError, ServingBase
from pagedllm.entrypoints.serving_chat import OpenAIServingChat
from pagedllm.entrypoints.serving_completion import OpenAIServingCompletion
from pagedllm.metrics import CONTENT_TYPE

logger = logging.getLogger(__name__)

_PROTECTED = ("/v1/", "/tokenize", "/detokenize")
_OPEN_WHILE_SHUTTING_DOWN = ("/metrics", "/version")
_DEAD_EXIT_DELAY_S = 1.0


def _error(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


class GuardMiddleware:
    """Pure ASGI (so streaming and disconnect detection are untouched): 503 while shutting
    down, then the Bearer key on /v1/*, /tokenize and /detokenize."""

    def __init__(self, app, engine: AsyncEngine, api_key: str | None) -> None:
        self.app, self.engine = app, engine
        self.api_key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            err = None
            if self.engine.shutting_down and not path.startswith(_OPEN_WHILE_SHUTTING_DOWN):
                err = APIError(503, "server is shutting down", type="service_unavailable")
            elif self.api_key is not None and path.startswith(_PROTECTED):
                auth = dict(scope["headers"]).get(b"authorization", b"")
                if not hmac.compare_digest(auth, b"Bearer " + self.api_key):
                    err = APIError(401, "missing or invalid API key (send 'Authorization: "
                                   "Bearer <key>')", type="authentication_error",
                                   code="invalid_api_key")
            if err is not None:
                await _error(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


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


def build_app(engine: AsyncEngine, served_model_names: list[str] | None = None,
              api_key: str | None = None,
              max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES) -> FastAPI:
    """The app; its lifespan starts and stops `engine`'s step thread."""
    names = served_model_names or [engine.model_name]
    completions = OpenAIServingCompletion(engine, names)
    chat = OpenAIServingChat(engine, names)
    base = ServingBase(engine, names)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start(asyncio.get_running_loop())
        yield
        await asyncio.to_thread(engine.stop)

    app = FastAPI(title="pagedllm", version=pagedllm.__version__, lifespan=lifespan)
    app.add_middleware(GuardMiddleware, engine=engine, api_key=api_key)
    # Added last = outermost: an oversized body is refused before auth or parsing.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_body_bytes,
                       on_reject=lambda: engine.metrics.observe_rejected("body_too_large"))

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return _error(APIError(400, f"malformed JSON body: {first.get('msg')} at "
                                   f"character {first.get('loc', ('', '?'))[-1]}"))
        # Unions report one error per member ("prompt.str", "prompt.list[int]"): name the field.
        loc = [str(x) for x in first.get("loc", ()) if x != "body"]
        param = loc[0] if loc else None
        msg = f"{'.'.join(loc)}: {first.get('msg')}" if loc else str(first.get("msg"))
        return _error(APIError(400, msg, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(APIError(exc.status_code, str(exc.detail), type=kind))

    # Engine failures of one request are answered here, not by the catch-all below
    # (Starlette re-raises what reaches that one, which can drop the keep-alive connection).
    @app.exception_handler(RequestFailed)
    async def _request_failed(_: Request, exc: RequestFailed) -> JSONResponse:
        return _error(APIError(500, str(exc), type="server_error"))

    @app.exception_handler(EngineDead)
    async def _engine_dead(_: Request, exc: EngineDead) -> JSONResponse:
        return _error(APIError(503, str(exc), type="service_unavailable"))

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return _error(APIError(500, f"internal error: {exc}", type="server_error"))

    @app.get("/health")
    async def health() -> Response:
        if engine.dead is not None:
            return _error(APIError(503, f"engine is dead: {engine.dead!r}",
                                   type="service_unavailable"))
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": pagedllm.__version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.render(engine.snapshot), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict:
        cards = [ModelCard(id=n, root=engine.engine.model_name, max_model_len=base.max_model_len)
                 for n in names]
        return ModelList(data=cards).model_dump()

    @app.post("/v1/completions")
    async def create_completion(body: CompletionRequest, request: Request) -> Response:
        return await with_disconnect(request, completions.create(body))

    @app.post("/v1/chat/completions")
    async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
        return await with_disconnect(request, chat.create(body))

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict:
        base.check_model(body.model)
        if body.messages is not None:
            ids = base.apply_chat_template(body.messages, body.add_generation_prompt)
        elif body.prompt is not None:
            ids = base.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        else:
            raise APIError(400, "either prompt or messages is required", param="prompt")
        return TokenizeResponse(count=len(ids), max_model_len=base.max_model_len,
                                tokens=ids).model_dump()

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict:
        base.check_model(body.model)
        base.check_token_ids(body.tokens, "tokens")
        return DetokenizeResponse(prompt=base.tokenizer.decode(body.tokens)).model_dump()

    return app


class _Server(uvicorn.Server):
    """uvicorn's server, except that SIGTERM/SIGINT first mark the engine as shutting down
    (new requests get 503) and abort in-flight requests, so connections close promptly."""

    def __init__(self, config: uvicorn.Config, engine: AsyncEngine) -> None:
        super().__init__(config)
        self.engine = engine

    def handle_exit(self, sig: int, frame) -> None:
        if not self.engine.shutting_down:
            logger.info("signal %d: shutting down, aborting in-flight requests", sig)
            self.engine.begin_shutdown()
        super().handle_exit(sig, frame)


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


def run_server(engine: AsyncEngine, *, host: str, port: int, served_model_names: list[str],
               api_key: str | None, access_log: bool = True,
               max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
               sock: socket.socket | None = None) -> int:
    """Serve until SIGTERM/SIGINT (returns 0 after a graceful shutdown) or until the engine
    thread dies (returns 1, so a supervisor restarts the process)."""
    app = build_app(engine, served_model_names, api_key, max_request_body_bytes)
    config = uvicorn.Config(app, host=host, port=port, access_log=access_log,
                            timeout_graceful_shutdown=30)
    server = _Server(config, engine)

    def on_dead(exc: BaseException) -> None:
        logger.critical("engine died (%r): shutting the server down", exc)
        # A moment for the failed responses to go out and /health to answer 503.
        asyncio.get_running_loop().call_later(_DEAD_EXIT_DELAY_S, setattr, server,
                                              "should_exit", True)

    engine.on_dead = on_dead
    # uvicorn re-raises the captured signal after shutting down; with these no-op handlers in
    # place underneath it, that ends the process with status 0 instead of dying by signal.
    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in handled}
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0 if server.started and engine.dead is None else 1
