"""What /v1/completions and /v1/chat/completions share: errors in the OpenAI shape, request
-> SamplingParams, context-length checks, token strings for logprobs, and SSE framing.

Runs on the event loop thread. It reads a few constants of the engine and shares its tokenizer
(encode without truncation/padding and decode only borrow the Rust tokenizer immutably, so they
may overlap the engine thread's detokenization), but never calls the engine: requests reach it
only through `AsyncEngine`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse

from pagedllm.engine.async_engine import (
    AsyncEngine,
    EngineDead,
    EngineOverloaded,
    EngineRequest,
    EngineShuttingDown,
    RequestStream,
)
from pagedllm.entrypoints.protocol import (
    ChatMessage,
    ErrorInfo,
    ErrorResponse,
    PromptTokensDetails,
    SamplingFields,
    UsageInfo,
)
from pagedllm.sampling_params import SamplingParams

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_DONE = "data: [DONE]\n\n"


class APIError(Exception):
    """An error answered as {"error": {"message", "type", "param", "code"}} with `status`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status, message, type, param, code)
        self.headers = headers

    def body(self) -> dict:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type,
                                             param=self.param, code=self.code)).model_dump()


def sse(payload: str) -> str:
    return f"data: {payload}\n\n"


def sse_error(err: APIError) -> str:
    return sse(json.dumps(err.body()))


class SSEResponse(StreamingResponse):
    """`text/event-stream` response that calls `on_close` however it ends (finished, client
    gone before or during the body, error), so an abandoned request is always aborted."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def make_usage(num_prompt: int, num_completion: int, num_cached: int) -> UsageInfo:
    """Token counts of a response; `num_cached`: prompt tokens served by the prefix cache."""
    return UsageInfo(prompt_tokens=num_prompt, completion_tokens=num_completion,
                     total_tokens=num_prompt + num_completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=num_cached))


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class ServingBase:
    """State and helpers of one served model."""

    def __init__(self, engine: AsyncEngine, served_model_names: list[str]) -> None:
        self.engine = engine
        self.tokenizer = engine.engine.tokenizer
        self.max_model_len: int = engine.engine.config.max_model_len
        self.vocab_size: int = engine.engine.vocab_size
        self.max_logprobs: int = engine.engine.config.max_logprobs
        self.model_names = served_model_names
        self._token_str: dict[int, str] = {}

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.model_names:
            raise APIError(404, f"The model `{model}` does not exist; this server serves "
                           f"{', '.join(self.model_names)}.", param="model",
                           code="model_not_found")

    # ------------------------------------------------------------ prompts
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def apply_chat_template(self, messages: list[ChatMessage],
                            add_generation_prompt: bool = True) -> list[int]:
        conv = [{"role": m.role, "content": message_text(m)} for m in messages]
        try:
            ids = self.tokenizer.apply_chat_template(
                conv, add_generation_prompt=add_generation_prompt, tokenize=True)
        except Exception as exc:  # jinja errors: the template rejected the conversation
            raise APIError(400, f"chat template failed: {exc}", param="messages") from exc
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def check_token_ids(self, ids: list[int], param: str) -> None:
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is out of range [0, {self.vocab_size})",
                           param=param)

    def check_length(self, num_prompt: int, max_tokens: int | None, param: str) -> None:
        """vLLM's rule: the prompt plus max_tokens must fit in max_model_len."""
        limit = self.max_model_len
        if num_prompt == 0:
            raise APIError(400, "prompt must not be empty", param=param)
        if num_prompt >= limit:
            raise APIError(400, f"prompt has {num_prompt} tokens, max_model_len is {limit} "
                           "(at least one token must be left for the output)", param=param,
                           code="context_length_exceeded")
        if max_tokens is not None and num_prompt + max_tokens > limit:
            raise APIError(400, f"prompt has {num_prompt} tokens and max_tokens is {max_tokens}: "
                           f"{num_prompt + max_tokens} > max_model_len {limit}",
                           param="max_tokens", code="context_length_exceeded")

    # ----------------------------------------------------------- sampling
    def sampling_params(self, req: SamplingFields, max_tokens: int | None,
                        logprobs: int | None) -> SamplingParams:
        if req.logit_bias:
            raise APIError(400, "logit_bias is not supported", param="logit_bias")
        try:
            return SamplingParams(
                n=req.n, temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=0 if req.top_k is None else req.top_k,
                min_p=0.0 if req.min_p is None else req.min_p,
                presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                repetition_penalty=(1.0 if req.repetition_penalty is None
                                    else req.repetition_penalty),
                seed=req.seed, max_tokens=max_tokens, min_tokens=req.min_tokens,
                ignore_eos=req.ignore_eos, stop=req.stop, stop_token_ids=req.stop_token_ids,
                include_stop_str_in_output=req.include_stop_str_in_output, logprobs=logprobs,
                skip_special_tokens=req.skip_special_tokens,
                spaces_between_special_tokens=req.spaces_between_special_tokens)
        except ValueError as exc:
            raise APIError(400, str(exc), param=_field_of(str(exc))) from exc

    # ---------------------------------------------------------- submitting
    async def submit(self, requests: list[EngineRequest]) -> RequestStream:
        try:
            return await self.engine.add_requests(requests)
        except (EngineShuttingDown, EngineDead) as exc:
            raise APIError(503, str(exc), type="service_unavailable") from exc
        except EngineOverloaded as exc:
            raise APIError(429, str(exc), type="rate_limit_error", code="rate_limit_exceeded",
                           headers={"Retry-After": str(exc.retry_after)}) from exc
        except ValueError as exc:
            raise APIError(400, str(exc), param=_field_of(str(exc))) from exc

    def token_str(self, token_id: int) -> str:
        s = self._token_str.get(token_id)
        if s is None:
            s = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_str[token_id] = s
        return s


def message_text(m: ChatMessage) -> str:
    if m.content is None or isinstance(m.content, str):
        return m.content or ""
    parts = []
    for part in m.content:
        if part.type != "text" or part.text is None:
            raise APIError(400, f"message content parts of type {part.type!r} are not supported "
                           "(text only)", param="messages")
        parts.append(part.text)
    return "".join(parts)


def _field_of(message: str) -> str | None:
    """SamplingParams messages start with the field name ("top_p must be in (0, 1], ...")."""
    head = message.split(" ", 1)[0]
    return head if head.isidentifier() else None
