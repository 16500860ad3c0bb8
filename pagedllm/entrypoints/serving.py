"""What /v1/completions and /v1/chat/completions share: errors in the OpenAI shape, request
-> SamplingParams, context-length checks, token strings for logprobs, and SSE framing.

Runs on the event loop thread. It reads a few constants of the engine and shares its tokenizer
(encode without truncation/padding and decode only borrow the Rust tokenizer immutably, so they
may overlap the engine thread's detokenization), but never calls the engine: requests reach it
only through `AsyncEngine`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse

from pagedllm.engine.admission import RequestNeverAdmittable
from pagedllm.engine.async_engine import (
    AsyncEngine,
    DuplicateRequestId,
    EngineDead,
    EngineOverloaded,
    EngineRequest,
    EngineShuttingDown,
    RequestStream,
)
from pagedllm.engine.chat_template import MissingChatTemplateError, check_chat_template
from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.prompt_inputs import PromptInputs
from pagedllm.entrypoints.protocol import (
    ChatMessage,
    SamplingFields,
)
from pagedllm.entrypoints.protocol_responses import (
    PromptTokensDetails,
    UsageInfo,
)
from pagedllm.entrypoints.request_fields import (
    check_request_fields,
    logit_bias_of,
    structured_outputs_of,
)
from pagedllm.entrypoints.server_options import ServerOptions
from pagedllm.entrypoints.serving_models import ServingModels
from pagedllm.errors import ModelNotFoundError
from pagedllm.lora.request import LoRARequest
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams, StructuredOutputsParams
from pagedllm.structured_output.backend import GrammarCompileError

__all__ = ["APIError", "ServingBase", "SSEResponse", "make_usage", "random_id", "sse",
           "sse_error"]

logger = logging.getLogger(__name__)
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_DONE = "data: [DONE]\n\n"
MAX_REQUEST_ID_CHARS = 128


def sse(payload: str) -> str:
    return f"data: {payload}\n\n"


def sse_error(err: APIError) -> str:
    return sse(json.dumps(err.body()))


class SSEResponse(StreamingResponse):
    """`text/event-stream` response that calls `on_close` however it ends (finished, client
    gone before or during the body, error), so an abandoned request is always aborted."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None],
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(content, media_type="text/event-stream",
                         headers={**SSE_HEADERS, **(headers or {})})
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


    def __init__(self, engine: AsyncEngine, served_model_names: list[str],
                 models: ServingModels | None = None, inputs: PromptInputs | None = None,
                 options: ServerOptions | None = None, log_requests: bool = True) -> None:
        self.engine = engine
        # One log line per accepted request (--disable-log-requests: off).
        self.log_requests = log_requests
        self.models = models or ServingModels(engine, served_model_names)
        self.tokenizer = engine.engine.tokenizer
        self.max_model_len: int = engine.engine.config.max_model_len
        self.inputs = inputs or PromptInputs(self.tokenizer, self.max_model_len)
        self.options = options or ServerOptions()
        self.vocab_size: int = engine.engine.vocab_size
        self.max_logprobs: int = engine.engine.config.max_logprobs
        self.model_names = served_model_names
        self._token_str: dict[int, str] = {}

    @property
    def model_name(self) -> str:
        return self.model_names[0]

    def response_model(self, lora: LoRARequest | None) -> str:
        """The `model` a response names: the adapter's name when one served it (vLLM's)."""
        return lora.lora_name if lora is not None else self.model_name

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter `model` names (None: the base model); 404 for unknown names."""
        try:
            return self.models.resolve(model)
        except ModelNotFoundError:
            raise APIError(404, f"The model `{model}` does not exist; this server serves "
                           f"{', '.join(self.models.all_names())}.", param="model",
                           code="model_not_found") from None

    # ------------------------------------------------------------ prompts
    async def encode(self, text: str, add_special_tokens: bool = True,
                     param: str = "prompt") -> list[int]:
        """Token ids of `text`, tokenized off the event loop (prompt_inputs.py)."""
        return await self.inputs.encode(text, param, add_special_tokens)

    async def encode_many(self, texts: list[str], param: str = "prompt") -> list[list[int]]:
        """Token ids of each text: every size checked first, then one worker-thread call."""
        return await self.inputs.encode_many(texts, param)

    async def apply_chat_template(self, messages: list[ChatMessage],
                                  add_generation_prompt: bool = True, *,
                                  tools: list[dict] | None = None,
                                  chat_template: str | None = None,
                                  chat_template_kwargs: dict | None = None) -> list[int]:
        """Token ids of the conversation; `tools` (OpenAI definitions) go to the template as
        `tools=`, or into a system message if the template has no place for them."""
        conv = [chat_message_dict(m) for m in messages]
        template = chat_template or self.tokenizer.chat_template or ""
        if tools and "tools" not in template:
            conv = with_tools_system_prompt(conv, tools)
        if chat_template is None:
            try:
                check_chat_template(self.tokenizer)
            except MissingChatTemplateError as exc:
                raise APIError(400, str(exc), param="messages") from None
        return await self.inputs.chat(conv, add_generation_prompt, tools=tools,
                                      chat_template=chat_template,
                                      chat_template_kwargs=chat_template_kwargs)

    def request_id(self, prefix: str, req: SamplingFields, header: str | None
                   ) -> tuple[str, str]:
        """(API id, id echoed in X-Request-Id): the client's X-Request-Id header, else its
        `request_id` field, else a random one; the engine's ids derive from the API id, so
        a client id already in flight is a 400 (AsyncEngine.add_requests)."""
        given = header if header is not None else req.request_id
        if given is None:
            api_id = random_id(prefix)
            return api_id, api_id
        if not (0 < len(given) <= MAX_REQUEST_ID_CHARS and given.isprintable()
                and given.isascii()):
            raise APIError(400, f"request id must be 1 to {MAX_REQUEST_ID_CHARS} printable "
                           f"ASCII characters, got {len(given)} characters", param="request_id")
        return f"{prefix}-{given}", given

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
                        logprobs: int | None,
                        structured: StructuredOutputsParams | None = None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        """400 for unimplemented fields; `structured` overrides the request's own constraint
        (tool_choice required / named), `prompt_logprobs` the request's own (echo)."""
        check_request_fields(req)
        if req.prompt_logprobs and req.stream:  # vLLM's rule (0 asks for nothing visible)
            raise APIError(400, "prompt_logprobs are not available with stream=true",
                           param="prompt_logprobs")
        for name in ("stop_token_ids", "allowed_token_ids"):
            if getattr(req, name):
                self.check_token_ids(getattr(req, name), name)
        if structured is None:
            structured = structured_outputs_of(req)
        # Unset fields: the model's generation_config.json defaults, else OpenAI's.
        d = self.engine.engine.sampling_defaults
        try:
            return SamplingParams(
                n=req.n, temperature=_pick(req.temperature, d, "temperature", 1.0),
                top_p=_pick(req.top_p, d, "top_p", 1.0), top_k=_pick(req.top_k, d, "top_k", 0),
                min_p=_pick(req.min_p, d, "min_p", 0.0),
                presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                repetition_penalty=_pick(req.repetition_penalty, d, "repetition_penalty", 1.0),
                seed=req.seed, max_tokens=max_tokens, min_tokens=req.min_tokens,
                ignore_eos=req.ignore_eos, stop=req.stop, stop_token_ids=req.stop_token_ids,
                include_stop_str_in_output=req.include_stop_str_in_output, logprobs=logprobs,
                prompt_logprobs=(req.prompt_logprobs if prompt_logprobs is None
                                 else prompt_logprobs),
                skip_special_tokens=req.skip_special_tokens,
                spaces_between_special_tokens=req.spaces_between_special_tokens,
                structured_outputs=structured, logit_bias=logit_bias_of(req),
                allowed_token_ids=req.allowed_token_ids, bad_words=req.bad_words)
        except ValueError as exc:
            raise APIError(400, str(exc), param=_field_of(str(exc))) from exc

    # ---------------------------------------------------------- submitting
    async def submit(self, requests: list[EngineRequest], log: bool = True) -> RequestStream:
        """Queue the requests; `log=False` for a call's later submissions (beam search steps)."""
        if self.log_requests and log:  # one bounded line per API call: sizes, never contents
            logger.info("request %s: %s, %s", requests[0].request_id,
                        prompts_summary(requests), params_summary(requests[0].params))
        try:
            await self._compile_grammar(requests[0].params)
            return await self.engine.add_requests(requests)
        except (EngineShuttingDown, EngineDead) as exc:
            raise APIError(503, str(exc), type="service_unavailable") from exc
        except GrammarCompileError as exc:  # the backend's message, e.g. "invalid regex: ..."
            raise APIError(400, str(exc)) from exc
        except EngineOverloaded as exc:
            raise APIError(429, str(exc), type="rate_limit_error", code="rate_limit_exceeded",
                           headers={"Retry-After": str(exc.retry_after)}) from exc
        except RequestNeverAdmittable as exc:
            raise APIError(400, str(exc), param="prompt", code="request_too_large") from exc
        except DuplicateRequestId as exc:
            raise APIError(400, str(exc), param="request_id") from exc
        except ValueError as exc:
            raise APIError(400, str(exc), param=_field_of(str(exc))) from exc

    async def _compile_grammar(self, params: SamplingParams) -> None:
        """Compile the request's output constraint in a worker thread (cached), so that the
        engine thread only copies it: a huge JSON schema took seconds to compile there, and
        no other request stepped meanwhile. GrammarCompileError is the caller's 400."""
        manager = getattr(self.engine.engine, "structured_output", None)
        if getattr(params, "structured_outputs", None) is not None and manager is not None:
            await asyncio.to_thread(manager.compiler.template, params.structured_outputs)

    def token_str(self, token_id: int) -> str:
        s = self._token_str.get(token_id)
        if s is None:
            s = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_str[token_id] = s
        return s


def prompts_summary(requests: list[EngineRequest]) -> str:
    sizes = [len(r.prompt) for r in requests]
    unit = "token ids" if isinstance(requests[0].prompt, list) else "characters"
    if len(sizes) == 1:
        return f"prompt of {sizes[0]} {unit}"
    return f"{len(sizes)} prompts of {sum(sizes)} {unit} in all"


def params_summary(p: SamplingParams | PoolingParams) -> str:
    """What a log line may say about a request's sampling: numbers and sizes (a 4 MB stop
    string made a 4 MB log line when the whole SamplingParams was logged)."""
    if isinstance(p, PoolingParams):
        return f"pooling task={p.task} dimensions={p.dimensions}"
    stops = p.stop if isinstance(p.stop, list) else [p.stop] if p.stop else []
    parts = [f"n={p.n}", f"max_tokens={p.max_tokens}", f"temperature={p.temperature}",
             f"top_p={p.top_p}", f"top_k={p.top_k}", f"seed={p.seed}"]
    if stops:
        parts.append(f"stop={len(stops)} strings/{sum(len(x) for x in stops)} chars")
    if p.logprobs is not None:
        parts.append(f"logprobs={p.logprobs}")
    if p.structured_outputs is not None:
        parts.append("structured_outputs")
    return "params " + " ".join(parts)


def _pick(value, defaults: dict, name: str, fallback):
    return value if value is not None else defaults.get(name, fallback)


def chat_message_dict(m: ChatMessage) -> dict:
    """A message as chat templates expect it: tool-call arguments as objects, not JSON text."""
    out: dict = {"role": m.role, "content": message_text(m)}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.tool_calls:
        calls = []
        for c in m.tool_calls:
            try:
                args = json.loads(c.function.arguments)
            except ValueError:
                args = c.function.arguments
            calls.append({"id": c.id, "type": "function",
                          "function": {"name": c.function.name, "arguments": args}})
        out["tool_calls"] = calls
    return out


def with_tools_system_prompt(conv: list[dict], tools: list[dict]) -> list[dict]:
    """For templates without tool support: describe the tools (Hermes style) in the system
    message, so that `auto` can still work with a model trained on that format."""
    text = ("You may call functions to answer. Available functions:\n<tools>\n"
            + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
            + "\n</tools>\nTo call a function, answer with <tool_call>{\"name\": <name>, "
            "\"arguments\": <arguments object>}</tool_call>.")
    if conv and conv[0]["role"] == "system":
        return [{**conv[0], "content": f"{conv[0]['content']}\n\n{text}"}, *conv[1:]]
    return [{"role": "system", "content": text}, *conv]


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
