"""POST /v1/messages and /v1/messages/count_tokens (the Anthropic Messages API), served by
the chat route: the request is translated (messages_convert.py), the chat route runs it
(template, sampling, structured output, tool calling, engine), and its result or stream is
translated back. Errors leave in Anthropic's shape (anthropic_errors.py).

A stream is Anthropic's event sequence:

    message_start, ping,
    (content_block_start, content_block_delta*, content_block_stop)*   one per block: thinking
                                                 (thinking_delta), text (text_delta), tool_use
                                                 (input_json_delta: the input's JSON text)
    message_delta (stop_reason, stop_sequence, usage), message_stop
    ... or an `error` event where the chat stream reports an engine error
"""

from __future__ import annotations

import json

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from pagedllm.entrypoints.anthropic_errors import AnthropicErrorShape, stream_error_body
from pagedllm.entrypoints.chat_reasoning import reasoning_effort_kwargs
from pagedllm.entrypoints.disconnect import with_disconnect
from pagedllm.entrypoints.messages_convert import (
    message_id,
    stop_reason,
    to_chat_request,
    to_message,
    tool_use_id,
)
from pagedllm.entrypoints.openapi_spec import POST_ERRORS
from pagedllm.entrypoints.protocol_anthropic import (
    AnthropicErrorResponse,
    CountTokensRequest,
    CountTokensResponse,
    MessagesRequest,
)
from pagedllm.entrypoints.serving_chat import OpenAIServingChat
from pagedllm.entrypoints.sse_translate import SSE_EVENT, TranslatedSSE, named_event

# The same statuses as the OpenAI routes, declared with Anthropic's error body.
MESSAGES_ERRORS = {
    status: {**spec, "model": AnthropicErrorResponse} for status, spec in POST_ERRORS.items()
}


STREAM_OR_JSON = {
    "description": "the message (JSON), or its events (SSE) with stream=true",
    "content": {"text/event-stream": {"schema": SSE_EVENT}},
}


class AnthropicServingMessages:
    """/v1/messages and /v1/messages/count_tokens over one `OpenAIServingChat` (its model
    names, template, sampling and tool handling)."""

    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    async def create(self, req: MessagesRequest, header_id: str | None = None) -> Response:
        resp = await self.chat.create(to_chat_request(req), header_id)
        msg_id = message_id()
        if req.stream:
            return TranslatedSSE(resp, MessagesStream(msg_id, req.stop_sequences))
        message = to_message(json.loads(resp.body), req, msg_id)
        return JSONResponse(
            message.model_dump(), headers={"X-Request-Id": resp.headers["x-request-id"]}
        )

    async def count_tokens(self, req: CountTokensRequest) -> CountTokensResponse:
        """The prompt's tokens as /v1/messages would render it (tools included)."""
        chat_req = to_chat_request(req, count_only=True)
        self.chat.check_model(chat_req.model)
        tools = [t.model_dump(exclude_none=True) for t in chat_req.tools or []]
        ids = await self.chat.apply_chat_template(
            chat_req.messages,
            True,
            tools=tools or None,
            chat_template_kwargs=reasoning_effort_kwargs(chat_req),
        )
        return CountTokensResponse(input_tokens=len(ids))


class MessagesStream:
    """Chat chunks -> Anthropic stream events (a `ChunkConverter`, see sse_translate.py)."""

    def __init__(self, msg_id: str, stop_sequences: list[str] | None) -> None:
        self.msg_id, self.stop_sequences = msg_id, stop_sequences
        self.started = self.failed = False
        self.block = -1  # index of the last block opened
        self.open: str | None = None  # "thinking" | "text" | "tool_use": the open block
        self.tool_index: int | None = None  # the chat tool-call index of the open tool_use
        self.input_tokens = self.output_tokens = 0
        self.finish: str | None = None
        self.matched = None  # the chat choice's stop_reason (a stop string, a token id)

    def chunk(self, data: dict) -> str:
        out = []
        usage = data.get("usage")
        if usage:
            self.input_tokens = usage["prompt_tokens"]
            self.output_tokens = usage["completion_tokens"]
        if not self.started:
            self.started = True
            out.append(
                named_event(
                    "message_start",
                    {
                        "type": "message_start",
                        "message": {
                            "id": self.msg_id,
                            "type": "message",
                            "role": "assistant",
                            "model": data["model"],
                            "content": [],
                            "stop_reason": None,
                            "stop_sequence": None,
                            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
                        },
                    },
                )
            )
            out.append(named_event("ping", {"type": "ping"}))
        for choice in data["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                if self.open != "thinking":
                    block = {"type": "thinking", "thinking": "", "signature": ""}
                    out.append(self._open(block, "thinking"))
                thinking = {"type": "thinking_delta", "thinking": delta["reasoning_content"]}
                out.append(self._delta(thinking))
            if delta.get("content"):
                if self.open != "text":
                    out.append(self._open({"type": "text", "text": ""}, "text"))
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or []:
                out.append(self._tool_delta(call))
            if choice.get("finish_reason") is not None:
                self.finish, self.matched = choice["finish_reason"], choice.get("stop_reason")
        return "".join(out)

    def _tool_delta(self, call: dict) -> str:
        out = []
        fn = call.get("function") or {}
        if call.get("id") or self.open != "tool_use" or call["index"] != self.tool_index:
            self.tool_index = call["index"]
            out.append(
                self._open(
                    {
                        "type": "tool_use",
                        "id": tool_use_id(call.get("id")),
                        "name": fn.get("name") or "",
                        "input": {},
                    },
                    "tool_use",
                )
            )
        if fn.get("arguments"):
            out.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return "".join(out)

    def _open(self, block: dict, kind: str) -> str:
        closed = self._close()
        self.block += 1
        self.open = kind
        return closed + named_event(
            "content_block_start",
            {"type": "content_block_start", "index": self.block, "content_block": block},
        )

    def _close(self) -> str:
        if self.open is None:
            return ""
        self.open = None
        return named_event(
            "content_block_stop", {"type": "content_block_stop", "index": self.block}
        )

    def _delta(self, delta: dict) -> str:
        return named_event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self.block, "delta": delta},
        )

    def error(self, error: dict) -> str:
        self.failed = True
        return named_event("error", stream_error_body(error))

    def done(self) -> str:
        if self.failed:
            return ""
        reason, sequence = stop_reason(self.finish, self.matched, self.stop_sequences)
        return (
            self._close()
            + named_event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": {"output_tokens": self.output_tokens},
                },
            )
            + named_event("message_stop", {"type": "message_stop"})
        )


def add_messages_routes(app: FastAPI, chat: OpenAIServingChat) -> None:
    """The Anthropic routes, and their error shape (outermost middleware: call this after
    every other middleware is added)."""
    serving = AnthropicServingMessages(chat)
    app.add_middleware(AnthropicErrorShape)

    @app.post("/v1/messages", responses={**MESSAGES_ERRORS, 200: STREAM_OR_JSON})
    async def create_message(body: MessagesRequest, request: Request) -> Response:
        header_id = request.headers.get("x-request-id")
        return await with_disconnect(request, serving.create(body, header_id))

    @app.post("/v1/messages/count_tokens", responses=MESSAGES_ERRORS)
    async def count_message_tokens(body: CountTokensRequest) -> CountTokensResponse:
        return await serving.count_tokens(body)
