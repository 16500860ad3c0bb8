"""OpenAI Responses API request models (pydantic): POST /v1/responses.

`input` items a request may carry (the shapes a response's `output` has too, so an agent loop
can send `response.output` back as input):

    {"role": "user" | "system" | "developer" | "assistant", "content": str | [parts]}
        parts: input_text / output_text (text); other part types are a 400
    {"type": "function_call", "call_id", "name", "arguments"}   a call the model made
    {"type": "function_call_output", "call_id", "output"}       the caller's answer to it
    {"type": "reasoning", ...}                                  dropped (as chat templates drop
                                                                earlier reasoning)

Fields of the API that would change the output but are not implemented are in `UNSUPPORTED`
with their neutral value: any other value is a 400 naming the field. Unknown fields are
ignored with a logged warning, as on the other OpenAI routes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, field_validator

from pagedllm.entrypoints.protocol import OpenAIBaseModel, RequestBody


class InputItem(OpenAIBaseModel):
    """One `input` item; which fields each type needs is checked when it is translated
    (responses_convert.py), so that a 400 names the item and what it lacks."""

    type: str | None = None  # None: a message ({"role", "content"})
    role: str | None = None
    content: str | list[dict[str, Any]] | None = None
    id: str | None = None
    status: str | None = None
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None  # function_call
    arguments: str | None = None  # function_call
    output: str | list[dict[str, Any]] | None = None  # function_call_output
    summary: Any = None  # reasoning items sent back (dropped)
    encrypted_content: Any = None


class FunctionTool(OpenAIBaseModel):
    """A function tool (the Responses shape: name and parameters at the top level)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunctionChoice(OpenAIBaseModel):
    type: Literal["function"]
    name: str


class TextFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(OpenAIBaseModel):
    format: TextFormat | None = None
    verbosity: Any = None  # a hint to OpenAI's models; does not change sampling here


class ReasoningConfig(OpenAIBaseModel):
    """`effort` reaches the chat template as reasoning_effort; summaries are not generated
    (400): the reasoning text itself is the reasoning item's content."""

    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(RequestBody):
    model_config = ConfigDict(extra="allow")
    UNSUPPORTED: ClassVar[dict[str, Any]] = {
        "background": False,
        "include": None,
        "truncation": "disabled",
        "top_logprobs": None,
        "conversation": None,
        "prompt": None,
        "max_tool_calls": None,
    }

    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None  # echoed in the response
    reasoning: ReasoningConfig | None = None
    thinking_token_budget: int | None = Field(default=None, ge=0)  # vLLM's, as on chat
    # Do not change the output: accepted, not used.
    user: str | None = None
    safety_identifier: Any = None
    prompt_cache_key: Any = None
    service_tier: Any = None
    stream_options: Any = None
    # Declared so that they are found (UNSUPPORTED), not implemented.
    background: Any = False
    include: Any = None
    truncation: Any = "disabled"
    top_logprobs: Any = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: Any = None

    @field_validator("include", "top_logprobs")
    @classmethod
    def _empty_is_neutral(cls, value: Any) -> Any:
        """`include: []` and `top_logprobs: 0` ask for nothing."""
        if value in ([], 0) or (isinstance(value, dict) and not any(value.values())):
            return None
        return value
