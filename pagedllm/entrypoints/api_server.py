"""The OpenAI-compatible HTTP server: FastAPI app (routes, errors; guard.py: auth, hosts,
content type, shutdown) and `run_server` (http_server.py: timeouts, graceful shutdown).

Errors have OpenAI's shape {"error": {"message", "type", "param", "code"}} (on /v1/messages*
Anthropic's, anthropic_errors.py; those routes: serving_messages.py): invalid
parameters and schema errors are 400 (not FastAPI's 422), an unknown model 404, a missing or
wrong API key 401, a non-JSON POST 415, and everything but /metrics and /version is 503 once
shutdown began.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response

import pagedllm
from pagedllm.config.vocabulary import DEFAULT_MAX_REQUEST_BODY_BYTES
from pagedllm.engine.async_engine import AsyncEngine, EngineDead, RequestFailed
from pagedllm.engine.metrics import CONTENT_TYPE
from pagedllm.entrypoints.body_limit import BodyLimitMiddleware
from pagedllm.entrypoints.chat_options import ChatOptions
from pagedllm.entrypoints.chat_page import add_chat_page
from pagedllm.entrypoints.disconnect import with_disconnect
from pagedllm.entrypoints.guard import GuardMiddleware, error_response
from pagedllm.entrypoints.http_server import DrainingServer, bind_socket, timed_h11
from pagedllm.entrypoints.lora_routes import add_lora_routes
from pagedllm.entrypoints.openapi_spec import (
    GET_ERRORS,
    HEALTH,
    METRICS,
    POST_ERRORS,
    without_422,
)
from pagedllm.entrypoints.prompt_inputs import PromptInputs
from pagedllm.entrypoints.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from pagedllm.entrypoints.protocol_responses import (
    DetokenizeResponse,
    ModelList,
    TokenizeResponse,
)
from pagedllm.entrypoints.response_store import ResponseStore
from pagedllm.entrypoints.server_options import ServerOptions
from pagedllm.entrypoints.serving import APIError, ServingBase
from pagedllm.entrypoints.serving_chat import OpenAIServingChat
from pagedllm.entrypoints.serving_completion import OpenAIServingCompletion
from pagedllm.entrypoints.serving_messages import add_messages_routes
from pagedllm.entrypoints.serving_models import ServingModels
from pagedllm.entrypoints.serving_pooling import OpenAIServingPooling, add_pooling_routes
from pagedllm.entrypoints.serving_responses import add_responses_routes
from pagedllm.entrypoints.template_sandbox import TemplateSandbox
from pagedllm.entrypoints.tokenizer_info import add_tokenizer_info_route
from pagedllm.lora.request import LoRARequest

__all__ = ["bind_socket", "build_app", "run_server", "with_disconnect"]
logger = logging.getLogger(__name__)

_error = error_response
_ALWAYS_GET = {k: v for k, v in GET_ERRORS.items() if k != 401}


def build_app(engine: AsyncEngine, served_model_names: list[str] | None = None,
              api_key: str | None = None,
              max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES, *,
              chat_options: ChatOptions | None = None,
              lora_modules: list[LoRARequest] | None = None, log_requests: bool = True,
              metrics_vllm_compat: bool = False,
              options: ServerOptions | None = None) -> FastAPI:
    """The app; its lifespan starts and stops `engine`'s step thread (and the template
    sandbox with --trust-request-chat-template). `lora_modules` are served under their names
    (already validated by `engine`)."""
    opts = options or ServerOptions()
    names = served_model_names or [engine.model_name]
    served = ServingModels(engine, names, lora_modules)
    tokenizer = engine.engine.tokenizer
    sandbox = (TemplateSandbox(tokenizer, opts.request_chat_template_timeout)
               if opts.trust_request_chat_template else None)
    inputs = PromptInputs(tokenizer, engine.engine.config.max_model_len, sandbox)
    shared = {"inputs": inputs, "options": opts, "log_requests": log_requests}
    completions = OpenAIServingCompletion(engine, names, served, chat_options=chat_options,
                                          **shared)
    chat = OpenAIServingChat(engine, names, served, chat_options=chat_options, **shared)
    base = ServingBase(engine, names, served, **shared)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if sandbox is not None:
            await asyncio.to_thread(sandbox.start)
        engine.start(asyncio.get_running_loop())
        yield
        await asyncio.to_thread(engine.stop)
        if sandbox is not None:
            sandbox.close()

    app = FastAPI(title="pagedllm", version=pagedllm.__version__, lifespan=lifespan)
    app.add_middleware(GuardMiddleware, engine=engine, api_key=api_key,
                       allowed_hosts=opts.allowed_hosts)
    # Added last = outermost: an oversized or stalled body is refused before auth or parsing.
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_body_bytes,
                       on_reject=lambda: engine.metrics.observe_rejected("body_too_large"),
                       timeout_s=opts.timeout_request_body)
    add_chat_page(app)

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
        text = str(first.get("msg")).removeprefix("Value error, ")
        msg = f"{'.'.join(loc)}: {text}" if loc else text
        return _error(APIError(400, msg, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        # e.g. Allow on a 405
        return _error(APIError(exc.status_code, str(exc.detail), type=kind,
                               headers=getattr(exc, "headers", None)))

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

    @app.api_route("/health", methods=["GET", "HEAD"], responses=HEALTH, response_class=Response)
    async def health() -> Response:
        if engine.dead is not None:
            return _error(APIError(503, f"engine is dead: {engine.dead!r}",
                                   type="service_unavailable"))
        return Response(status_code=200)

    @app.get("/version", responses=_ALWAYS_GET)
    async def version() -> dict:
        return {"version": pagedllm.__version__}

    @app.get("/metrics", response_class=PlainTextResponse, responses=METRICS)
    async def metrics() -> Response:
        return Response(engine.metrics.render(vllm_compat=metrics_vllm_compat),
                        media_type=CONTENT_TYPE)

    @app.get("/v1/models", responses=GET_ERRORS)
    async def models() -> dict:
        return ModelList(data=served.cards(base.max_model_len)).model_dump()

    @app.post("/v1/completions", responses=POST_ERRORS)
    async def create_completion(body: CompletionRequest, request: Request) -> Response:
        header_id = request.headers.get("x-request-id")
        return await with_disconnect(request, completions.create(body, header_id))

    @app.post("/v1/chat/completions", responses=POST_ERRORS)
    async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
        header_id = request.headers.get("x-request-id")
        return await with_disconnect(request, chat.create(body, header_id))

    @app.post("/tokenize", responses=POST_ERRORS)
    async def tokenize(body: TokenizeRequest) -> dict:
        base.check_model(body.model)
        if body.messages is not None:
            ids = await base.apply_chat_template(body.messages, body.add_generation_prompt)
        elif body.prompt is not None:
            ids = await base.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        else:
            raise APIError(400, "either prompt or messages is required", param="prompt")
        return TokenizeResponse(count=len(ids), max_model_len=base.max_model_len,
                                tokens=ids).model_dump()

    @app.post("/detokenize", responses=POST_ERRORS)
    async def detokenize(body: DetokenizeRequest) -> dict:
        base.check_model(body.model)
        base.check_token_ids(body.tokens, "tokens")
        return DetokenizeResponse(prompt=base.tokenizer.decode(body.tokens)).model_dump()

    add_lora_routes(app, served)
    add_pooling_routes(app, OpenAIServingPooling(engine, names, served, **shared))
    if opts.enable_tokenizer_info_endpoint:
        add_tokenizer_info_route(app, tokenizer)
    add_responses_routes(app, chat, ResponseStore(opts.max_stored_responses))
    add_messages_routes(app, chat)  # last: its error-shape middleware is the outermost
    without_422(app)
    return app


def run_server(engine: AsyncEngine, *, host: str, port: int, served_model_names: list[str],
               api_key: str | None, access_log: bool = True,
               max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
               sock: socket.socket | None = None, chat_options: ChatOptions | None = None,
               lora_modules: list[LoRARequest] | None = None, log_requests: bool = True,
               uvicorn_log_level: str = "info", metrics_vllm_compat: bool = False,
               options: ServerOptions | None = None) -> int:
    """Serve until SIGTERM/SIGINT (returns 0 after a graceful shutdown, http_server.py) or
    until the engine thread dies (returns 1, so a supervisor restarts the process)."""
    opts = options or ServerOptions()
    app = build_app(engine, served_model_names, api_key, max_request_body_bytes,
                    chat_options=chat_options,
                    lora_modules=lora_modules, log_requests=log_requests,
                    metrics_vllm_compat=metrics_vllm_compat, options=opts)
    config = uvicorn.Config(app, host=host, port=port, access_log=access_log,
                            log_level=uvicorn_log_level, timeout_graceful_shutdown=5,
                            http=timed_h11(opts.timeout_request_header),
                            timeout_keep_alive=opts.timeout_keep_alive,
                            limit_concurrency=opts.limit_concurrency)
    server = DrainingServer(config, engine, opts.shutdown_timeout)
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
