"""OpenAI-compatible request models (pydantic), plus vLLM's sampling extras; the error body.
Response models: protocol_responses.py.

Requests keep unknown fields in `model_extra` (the `openai` client sends `extra_body` keys at
the top level): the serving code ignores them with a logged warning. Fields of the OpenAI or
vLLM API that would change the output but are not implemented are declared in `UNSUPPORTED`
with their neutral value; any other value is answered 400 naming the field
(entrypoints/request_fields.py).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pagedllm.entrypoints.json_hygiene import check_json_tree


class OpenAIBaseModel(BaseModel):
    # Strict as OpenAI is: "10" is not an int, true is not a token id; NaN / Infinity (which
    # Python's JSON parser accepts) are refused by every float field.
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


# ---------------------------------------------------------------- errors
class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


# -------------------------------------------------------------- requests
class RequestBody(OpenAIBaseModel):
    """A route's whole body: checked for depth and lone surrogates before validation."""

    @model_validator(mode="before")
    @classmethod
    def _hygiene(cls, data: Any) -> Any:
        check_json_tree(data)
        return data


class StreamOptions(OpenAIBaseModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM: usage (so far) in every chunk too


class JsonSchemaFormat(OpenAIBaseModel):
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(RequestBody):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="allow")
    # field -> its neutral value; any other value is a 400 (not implemented)
    UNSUPPORTED: ClassVar[dict[str, Any]] = {
        "use_beam_search": False, "length_penalty": 1.0,
        "truncate_prompt_tokens": None, "logits_processors": None,
        "return_tokens_as_token_ids": False, "vllm_xargs": None, "kv_transfer_params": None,
        "thinking_token_budget": None, "logprob_token_ids": None, "truncation_side": None,
        "repetition_detection": None}
    # Declared below and ignored without a warning: they do not change the output (there is
    # one grammar backend; `prediction` only speeds up a server that implements it).
    IGNORED: ClassVar[tuple[str, ...]] = (
        "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
        "prediction", "guided_decoding_backend")

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)  # what a generator takes
    stop: str | list[str] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    cache_salt: str | None = None  # requests with different salts never share cached KV
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    # constrained decoding: OpenAI's response_format, vLLM's structured_outputs (and the
    # older guided_* names)
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    # vLLM's: the prompt tokens' logprobs (+ top k) in the response; not with stream=true
    prompt_logprobs: int | None = None
    # declared so that they are found (see UNSUPPORTED / IGNORED), not implemented
    use_beam_search: Any = False
    length_penalty: Any = 1.0
    truncate_prompt_tokens: Any = None
    logits_processors: Any = None
    return_tokens_as_token_ids: Any = False
    vllm_xargs: Any = None
    kv_transfer_params: Any = None
    thinking_token_budget: Any = None
    logprob_token_ids: Any = None
    truncation_side: Any = None
    repetition_detection: Any = None
    guided_decoding_backend: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    safety_identifier: Any = None
    prediction: Any = None
    # Implemented: scheduling priority (lower runs earlier; needs --scheduling-policy
    # priority), the request's id (also the X-Request-Id header), token ids in the response.
    priority: int = 0
    request_id: str | None = None
    return_token_ids: bool = False


class CompletionRequest(SamplingFields):
    # beam search is implemented here (entrypoints/serving_beam_search.py), not on chat
    UNSUPPORTED: ClassVar[dict[str, Any]] = {
        k: v for k, v in SamplingFields.UNSUPPORTED.items()
        if k not in ("use_beam_search", "length_penalty")}

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    # vLLM's beam search: n beams; HF's length_penalty and early_stopping
    use_beam_search: bool = False
    length_penalty: float = 1.0
    early_stopping: bool | Literal["never"] = False


class TextPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str  # a JSON string, as OpenAI sends it


class ToolCall(OpenAIBaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn that called tools
    tool_call_id: str | None = None  # a "tool" turn answering that call


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    UNSUPPORTED: ClassVar[dict[str, Any]] = {
        **{k: v for k, v in SamplingFields.UNSUPPORTED.items() if k != "thinking_token_budget"},
        "audio": None, "modalities": None, "functions": None,
        "function_call": None, "web_search_options": None,
        "verbosity": None, "documents": None, "continue_final_message": False,
        "echo": False, "mm_processor_kwargs": None}
    audio: Any = None
    modalities: Any = None
    functions: Any = None
    function_call: Any = None
    web_search_options: Any = None
    # reasoning (chat_reasoning.py): the effort reaches the chat template; the budget caps
    # the thinking (needs --reasoning-parser); include_reasoning=false drops its text
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    thinking_token_budget: int | None = Field(default=None, ge=0)
    include_reasoning: bool = True
    verbosity: Any = None
    documents: Any = None
    continue_final_message: Any = False
    echo: Any = False
    mm_processor_kwargs: Any = None


class TokenizeRequest(RequestBody):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: list[int]
