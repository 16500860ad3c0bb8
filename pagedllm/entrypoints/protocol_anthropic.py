"""Anthropic Messages API models (pydantic): POST /v1/messages and /v1/messages/count_tokens
requests, the message a call returns, and Anthropic's error body.

Content blocks a request may carry: `text`, `tool_use` (an assistant turn's call),
`tool_result` (a user turn's answer to one) and, in assistant turns only, `thinking` /
`redacted_thinking` (dropped, as chat templates drop earlier reasoning). `cache_control` and
`citations` on a block are hints that do not change the output here (prefix caching is
automatic): accepted and not used. Other block types (image, document, ...) are a 400 naming
the type (messages_convert.py). Request fields Anthropic defines that this server does not
implement are in `UNSUPPORTED` with their neutral value: any other value is a 400.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field

from pagedllm.entrypoints.protocol import OpenAIBaseModel, RequestBody


# ---------------------------------------------------------------- errors
class AnthropicErrorInfo(OpenAIBaseModel):
    type: str
    message: str


class AnthropicErrorResponse(OpenAIBaseModel):
    """{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}"""

    type: Literal["error"] = "error"
    error: AnthropicErrorInfo


# -------------------------------------------------------------- requests
class TextBlock(OpenAIBaseModel):
    type: Literal["text"]
    text: str
    cache_control: Any = None  # a caching hint: accepted, prefix caching is automatic
    citations: Any = None


class ContentBlock(OpenAIBaseModel):
    """Any block of a message's content; which fields a type needs is checked when the
    request is translated (a 400 naming the block), so that an unsupported type is reported
    as such rather than as a missing field."""

    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    input: dict[str, Any] | None = None  # tool_use
    tool_use_id: str | None = None  # tool_result
    content: str | list[ContentBlock] | None = None  # tool_result
    is_error: bool = False  # tool_result
    cache_control: Any = None
    citations: Any = None


class InputMessage(OpenAIBaseModel):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class ToolDefinition(OpenAIBaseModel):
    """A client tool; `type` absent or "custom" (server tools such as web_search are 400)."""

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]
    type: str | None = None
    cache_control: Any = None


class ToolChoice(OpenAIBaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # type "tool"
    disable_parallel_tool_use: bool = False


class JsonOutputFormat(OpenAIBaseModel):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(OpenAIBaseModel):
    """`format` constrains the answer to a JSON schema (the chat route's structured output);
    `effort` reaches the chat template as `reasoning_effort` (values the chat route does not
    know, such as "max", are a 400 there)."""

    effort: str | None = None
    format: JsonOutputFormat | None = None


class ThinkingConfig(OpenAIBaseModel):
    """Thinking of a model served with --reasoning-parser (messages_convert.py):
    enabled + budget_tokens -> thinking_token_budget; disabled -> the template variable
    enable_thinking=false (Qwen3's switch); adaptive -> the model's own choice;
    display "omitted" -> no thinking blocks (include_reasoning=false)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)
    display: Literal["summarized", "omitted"] | None = None


class Metadata(OpenAIBaseModel):
    user_id: str | None = None


class MessagesFields(RequestBody):
    """What /v1/messages and /v1/messages/count_tokens share: the conversation and tools."""

    model: str
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    output_config: OutputConfig | None = None
    # Routing and caching hints of Anthropic's service: they do not change the output.
    cache_control: Any = None
    inference_geo: Any = None
    speed: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None
    # field -> neutral value; any other value is a 400 (not implemented here)
    UNSUPPORTED: ClassVar[dict[str, Any]] = {
        "mcp_servers": None,
        "container": None,
        "context_management": None,
        "output_format": None,
    }
    thinking: ThinkingConfig | None = None
    mcp_servers: Any = None
    container: Any = None
    context_management: Any = None
    output_format: Any = None


class MessagesRequest(MessagesFields):
    """POST /v1/messages. Unknown fields are ignored with a logged warning (as on the OpenAI
    routes); `metadata` and `service_tier` do not change the output. `temperature`, `top_p`
    and `top_k` are no longer in the anthropic SDK's signature: clients send them in
    `extra_body`."""

    model_config = ConfigDict(extra="allow")
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    service_tier: str | None = None


class CountTokensRequest(MessagesFields):
    """POST /v1/messages/count_tokens: the prompt part of a messages request."""


# ------------------------------------------------------------- responses
class OutputTextBlock(OpenAIBaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(OpenAIBaseModel):
    """The model's reasoning (--reasoning-parser). There is no signature to give: it is
    empty, and thinking blocks sent back are dropped from the prompt."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""


class ToolUseBlock(OpenAIBaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class Usage(OpenAIBaseModel):
    input_tokens: int
    output_tokens: int


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Message(OpenAIBaseModel):
    """The assistant message a (non-streamed) call returns."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ThinkingBlock | OutputTextBlock | ToolUseBlock]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: Usage


class CountTokensResponse(OpenAIBaseModel):
    input_tokens: int
