"""What the Anthropic Messages and OpenAI Responses translations share: the chat request
they build, validated as the chat route's own body, so that a value the chat route refuses
(an unknown reasoning effort, a negative budget) is a 400 naming the other API's field
rather than a 500."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.protocol import ChatCompletionRequest


def chat_request(body: dict[str, Any], fields: dict[str, str]) -> ChatCompletionRequest:
    """`body` as a ChatCompletionRequest; `fields`: chat field -> the field the client sent
    (for the 400's message and param)."""
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(x) for x in first.get("loc", ())]
        name = fields.get(loc[0], loc[0]) if loc else None
        text = str(first.get("msg")).removeprefix("Value error, ")
        raise APIError(400, f"{name}: {text}" if name else text, param=name) from None
