"""OpenAI-compatible response models (pydantic): completions, chat, chunks, models, tokenize.

vLLM's `return_token_ids` fields (`prompt_token_ids`, `token_ids`) appear only when a request
asked for them. Request models are in protocol.py.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import Field, model_serializer

from pagedllm.entrypoints.protocol import OpenAIBaseModel, ToolCall


class PromptTokensDetails(OpenAIBaseModel):
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class CompletionTokensDetails(OpenAIBaseModel):
    reasoning_tokens: int = 0  # output tokens inside the thinking (--reasoning-parser)


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None  # reasoning models only

    @model_serializer(mode="wrap")
    def _drop_unset_details(self, handler):
        data = handler(self)
        if data.get("completion_tokens_details") is None:
            data.pop("completion_tokens_details", None)
        return data


def _drop_unset_reasoning(data: dict) -> dict:
    """Reasoning fields appear only with a reasoning parser (`reasoning` is vLLM's newer
    name of `reasoning_content`; both are sent)."""
    for key in ("reasoning_content", "reasoning"):
        if key in data and data[key] is None:
            del data[key]
    return data


class CompletionLogprobs(OpenAIBaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(OpenAIBaseModel):
    """One token's entry in vLLM's `prompt_logprobs` ({token id: this} per prompt position)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobsJSON = list[dict[int, PromptLogprob] | None]


def _drop_unset_ids(data: dict) -> dict:
    """The `return_token_ids` fields (and `prompt_logprobs`) appear only when asked for."""
    for key in ("prompt_token_ids", "token_ids", "prompt_logprobs"):
        if key in data and data[key] is None:
            del data[key]
    return data


class CompletionChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids (vLLM's shape)
    token_ids: list[int] | None = None
    prompt_logprobs: PromptLogprobsJSON | None = None  # vLLM's prompt_logprobs (or echo)

    @model_serializer(mode="wrap")
    def _ids(self, handler):
        return _drop_unset_ids(handler(self))


class CompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class TopLogprob(OpenAIBaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(OpenAIBaseModel):
    content: list[ChatTokenLogprob] | None = None


class AssistantMessage(OpenAIBaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _reasoning(self, handler):
        return _drop_unset_reasoning(handler(self))


class ChatChoice(OpenAIBaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # return_token_ids

    @model_serializer(mode="wrap")
    def _ids(self, handler):
        return _drop_unset_ids(handler(self))


class ChatCompletionResponse(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_token_ids: list[int] | None = None  # return_token_ids
    prompt_logprobs: PromptLogprobsJSON | None = None  # vLLM's prompt_logprobs field

    @model_serializer(mode="wrap")
    def _ids(self, handler):
        return _drop_unset_ids(handler(self))


class DeltaFunctionCall(OpenAIBaseModel):
    name: str | None = None
    arguments: str | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}


class DeltaToolCall(OpenAIBaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler):
        return {k: v for k, v in handler(self).items() if v is not None}


class DeltaMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler):  # OpenAI sends {"content": "x"}, not {"role": null, ...}
        return {k: v for k, v in handler(self).items() if v is not None}


class ChatChunkChoice(OpenAIBaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # return_token_ids: this chunk's

    @model_serializer(mode="wrap")
    def _ids(self, handler):
        return _drop_unset_ids(handler(self))


class ChatCompletionChunk(OpenAIBaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids: in the first chunk

    @model_serializer(mode="wrap")
    def _ids(self, handler):
        return _drop_unset_ids(handler(self))


class CompletionChunk(OpenAIBaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "pagedllm"
    root: str | None = None
    parent: str | None = None  # LoRA adapters: the base model they apply to
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str
