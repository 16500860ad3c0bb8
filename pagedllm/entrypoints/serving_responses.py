"""POST /v1/responses, GET and DELETE /v1/responses/{id} (the OpenAI Responses API), served
by the chat route: the request (with the stored conversation of `previous_response_id`) is
translated into a chat request (responses_convert.py), the chat route runs it (template,
sampling, structured output, tool calling, reasoning, engine), and its result
(responses_output.py) or stream (responses_stream.py) is translated back. With `store` (the
default, as OpenAI's) the finished response is kept in a bounded in-memory store
(response_store.py).
"""

from __future__ import annotations

import json
import time

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response

from pagedllm.entrypoints.disconnect import with_disconnect
from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.openapi_spec import GET_ERRORS, POST_ERRORS
from pagedllm.entrypoints.protocol import ErrorResponse
from pagedllm.entrypoints.protocol_openai_responses import ResponsesRequest
from pagedllm.entrypoints.response_store import ResponseStore, StoredResponse
from pagedllm.entrypoints.responses_convert import input_items, to_chat_request
from pagedllm.entrypoints.responses_output import (
    chat_usage,
    item_id,
    output_items,
    response_object,
)
from pagedllm.entrypoints.responses_stream import ResponsesStream
from pagedllm.entrypoints.serving_chat import OpenAIServingChat
from pagedllm.entrypoints.sse_translate import SSE_EVENT, TranslatedSSE

# 200: the response object, or with "stream": true its event stream.
CREATE_RESPONSES = {
    **POST_ERRORS,
    200: {
        "description": "the response (JSON), or its events (SSE) with stream=true",
        "content": {"text/event-stream": {"schema": SSE_EVENT}},
    },
}
BY_ID_ERRORS = {
    **GET_ERRORS,
    404: {
        "model": ErrorResponse,
        "description": "no stored response with that id (never stored, evicted, deleted)",
    },
}


class OpenAIServingResponses:
    """/v1/responses over one `OpenAIServingChat`, with `store` holding finished responses
    for previous_response_id and GET / DELETE."""

    def __init__(self, chat: OpenAIServingChat, store: ResponseStore) -> None:
        self.chat, self.store = chat, store

    async def create(self, req: ResponsesRequest, header_id: str | None = None) -> Response:
        prior: list[dict] = []
        if req.previous_response_id is not None:
            prior = self._get(req.previous_response_id, "previous_response_id").conversation
        items = [*prior, *input_items(req)]
        resp = await self.chat.create(to_chat_request(req, items), header_id)
        resp_id, created = item_id("resp"), int(time.time())

        def complete(final: dict) -> None:
            if req.store:
                self.store.put(StoredResponse(final, [*items, *final["output"]]))

        if req.stream:
            return TranslatedSSE(resp, ResponsesStream(req, resp_id, created, complete))
        chat = json.loads(resp.body)
        finish = chat["choices"][0]["finish_reason"]
        final = response_object(
            req,
            resp_id,
            created,
            chat["model"],
            "incomplete" if finish == "length" else "completed",
            output_items(chat),
            chat_usage(chat["usage"]),
        )
        complete(final)
        return JSONResponse(final, headers={"X-Request-Id": resp.headers["x-request-id"]})

    def retrieve(self, response_id: str) -> dict:
        return self._get(response_id, "response_id").response

    def delete(self, response_id: str) -> dict:
        if not self.store.delete(response_id):
            raise self._not_found(response_id, "response_id")
        return {"id": response_id, "object": "response", "deleted": True}

    def _get(self, response_id: str, param: str) -> StoredResponse:
        entry = self.store.get(response_id)
        if entry is None:
            raise self._not_found(response_id, param)
        return entry

    def _not_found(self, response_id: str, param: str) -> APIError:
        what = "Previous response" if param == "previous_response_id" else "Response"
        return APIError(
            404,
            f"{what} with id {response_id!r} not found (responses are kept "
            f"in memory, the last {self.store.max_responses} stored; a restart "
            "forgets them)",
            param=param,
            code="response_not_found",
        )


def add_responses_routes(app: FastAPI, chat: OpenAIServingChat, store: ResponseStore) -> None:
    serving = OpenAIServingResponses(chat, store)

    @app.post("/v1/responses", responses=CREATE_RESPONSES)
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        header_id = request.headers.get("x-request-id")
        return await with_disconnect(request, serving.create(body, header_id))

    # One route for both methods, so that a 405 on the path lists both in Allow.
    @app.api_route("/v1/responses/{response_id}", methods=["GET", "DELETE"], responses=BY_ID_ERRORS)
    async def response_by_id(response_id: str, request: Request) -> dict:
        """GET: the stored response; DELETE: forget it."""
        if request.method == "DELETE":
            return serving.delete(response_id)
        if request.query_params.get("stream", "false").lower() not in ("false", "0"):
            raise APIError(
                400,
                "stream on GET /v1/responses/{id} is not supported (no background responses)",
                param="stream",
            )
        return serving.retrieve(response_id)
