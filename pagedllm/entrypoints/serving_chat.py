"""/v1/chat/completions: messages through the model's chat template, n choices, tool calls,
reasoning.

Streams start with a role delta per choice (sent at once, before the first token exists), then
one delta per engine step (reasoning, content, or tool-call deltas: see chat_choice.py); each
choice's finish_reason appears in its last chunk only ("tool_calls" when it called tools).
"""

from __future__ import annotations

import time
from dataclasses import replace

from starlette.responses import JSONResponse, Response

from pagedllm.engine.async_engine import EngineRequest, RequestAborted, RequestStream
from pagedllm.entrypoints.chat_choice import ChoiceText
from pagedllm.entrypoints.chat_logprobs import chat_logprobs
from pagedllm.entrypoints.chat_options import ChatOptions
from pagedllm.entrypoints.chat_reasoning import (
    ReasoningPlan,
    keeps_special_tokens,
    plan_reasoning,
    reasoning_effort_kwargs,
)
from pagedllm.entrypoints.completion_logprobs import prompt_logprobs_json
from pagedllm.entrypoints.protocol import (
    ChatCompletionRequest,
)
from pagedllm.entrypoints.protocol_responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionTokensDetails,
    DeltaMessage,
    UsageInfo,
)
from pagedllm.entrypoints.serving import (
    SSE_DONE,
    APIError,
    ServingBase,
    SSEResponse,
    make_usage,
    sse,
    sse_error,
)
from pagedllm.entrypoints.tool_calls import ToolPlan, plan_tools, strict_response_format
from pagedllm.outputs import RequestOutput


class OpenAIServingChat(ServingBase):
    def __init__(
        self,
        engine,
        served_model_names: list[str],
        models=None,
        *,
        chat_options: ChatOptions | None = None,
        **shared,
    ) -> None:
        super().__init__(engine, served_model_names, models, **shared)
        self.chat_options = chat_options or ChatOptions()

    async def create(self, req: ChatCompletionRequest, header_id: str | None = None) -> Response:
        lora = self.check_model(req.model)
        num_top = None
        if req.top_logprobs is not None:
            if not req.logprobs:
                raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
            if not 0 <= req.top_logprobs <= self.max_logprobs:
                raise APIError(
                    400,
                    f"top_logprobs must be in [0, {self.max_logprobs}], got {req.top_logprobs}",
                    param="top_logprobs",
                )
        if req.logprobs:
            num_top = req.top_logprobs or 0
        max_tokens = (
            req.max_tokens if req.max_completion_tokens is None else req.max_completion_tokens
        )
        plan = plan_tools(req, self.chat_options)
        special = plan.parser is not None and plan.parser.special_tokens
        if special or keeps_special_tokens(self.chat_options.reasoning_parser):
            req.skip_special_tokens = False  # the parsers' markers are special tokens (as vLLM)
        structured = plan.structured or strict_response_format(req, self.chat_options)
        params = self.sampling_params(req, max_tokens, num_top, structured=structured)
        api_id, echoed_id = self.request_id("chatcmpl", req, header_id)
        ids = await self.apply_chat_template(
            req.messages,
            req.add_generation_prompt,
            tools=plan.tools or None,
            chat_template=req.chat_template,
            chat_template_kwargs=reasoning_effort_kwargs(req),
        )
        self.check_length(len(ids), max_tokens, "messages")
        reasoning, thinking = plan_reasoning(
            req,
            self.chat_options.reasoning_parser,
            self.tokenizer,
            ids,
            grammar=params.structured_outputs is not None,
        )
        if thinking is not None:  # the grammar waits for the thinking; the budget caps it
            params = replace(params, thinking=thinking)
        stream = await self.submit(
            [
                EngineRequest(
                    api_id,
                    ids,
                    params,
                    time.monotonic(),
                    cache_salt=req.cache_salt,
                    lora_request=lora,
                    priority=req.priority,
                )
            ]
        )
        prompt_ids = ids if req.return_token_ids else None
        headers = {"X-Request-Id": echoed_id}
        model = self.response_model(lora)
        if req.stream:
            gen = self._stream(
                req, model, plan, reasoning, api_id, stream, prompt_ids or [], len(ids), num_top
            )
            return SSEResponse(gen, on_close=stream.abort, headers=headers)
        try:
            return JSONResponse(
                await self._full(
                    model, plan, reasoning, api_id, stream, len(ids), num_top, prompt_ids
                ),
                headers=headers,
            )
        finally:
            stream.abort()

    async def _full(
        self,
        model: str,
        plan: ToolPlan,
        reasoning: ReasoningPlan | None,
        api_id: str,
        stream: RequestStream,
        num_prompt: int,
        num_top: int | None,
        prompt_ids: list[int] | None,
    ) -> dict:
        final: RequestOutput | None = None
        try:
            async for outs in stream:
                final = outs[-1]
        except RequestAborted as exc:
            raise APIError(503, str(exc), type="service_unavailable") from exc
        assert final is not None
        choices = []
        for c in final.outputs:
            message = ChoiceText(plan, reasoning).message(c.text)
            finish = _tool_finish(c.finish_reason) if message.tool_calls else c.finish_reason
            choices.append(
                ChatChoice(
                    index=c.index,
                    message=message,
                    logprobs=chat_logprobs(self.token_str, c.token_ids, c.logprobs, num_top),
                    finish_reason=finish,
                    stop_reason=c.stop_reason,
                    token_ids=list(c.token_ids) if prompt_ids else None,
                )
            )
        completion = sum(len(c.token_ids) for c in final.outputs)
        usage = make_usage(num_prompt, completion, final.num_cached_tokens)
        if reasoning is not None:
            usage.completion_tokens_details = CompletionTokensDetails(
                reasoning_tokens=sum(reasoning.reasoning_tokens(c.token_ids) for c in final.outputs)
            )
        return ChatCompletionResponse(
            id=api_id,
            model=model,
            choices=choices,
            usage=usage,
            prompt_token_ids=prompt_ids,
            prompt_logprobs=prompt_logprobs_json(final.prompt_logprobs),
        ).model_dump()

    async def _stream(
        self,
        req: ChatCompletionRequest,
        model: str,
        plan: ToolPlan,
        reasoning: ReasoningPlan | None,
        api_id: str,
        stream: RequestStream,
        prompt_ids: list[int],
        num_prompt: int,
        num_top: int | None,
    ):
        """`prompt_ids` non-empty: return_token_ids (prompt ids in the first chunk, each
        chunk's token ids on its choice)."""
        created, n = int(time.time()), req.n
        opts = req.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts and opts.continuous_usage_stats)
        done, tokens = [False] * n, [0] * n
        texts = [ChoiceText(plan, reasoning) for _ in range(n)]
        output_ids: list[list[int]] = [[] for _ in range(n)]  # for reasoning_tokens
        cached = 0  # prompt tokens found in the prefix cache

        def usage_now() -> UsageInfo:
            usage = make_usage(num_prompt, sum(tokens), cached)
            if reasoning is not None:
                usage.completion_tokens_details = CompletionTokensDetails(
                    reasoning_tokens=sum(reasoning.reasoning_tokens(ids) for ids in output_ids)
                )
            return usage

        def chunk(choice: ChatChunkChoice, first_ids: list[int] | None = None) -> str:
            usage = usage_now() if continuous else None
            return sse(
                ChatCompletionChunk(
                    id=api_id,
                    created=created,
                    model=model,
                    choices=[choice],
                    usage=usage,
                    prompt_token_ids=first_ids,
                ).model_dump_json()
            )

        try:
            yield "".join(
                chunk(
                    ChatChunkChoice(index=i, delta=DeltaMessage(role="assistant", content="")),
                    prompt_ids if i == 0 and prompt_ids else None,
                )
                for i in range(n)
            )
            async for outs in stream:
                events = []
                cached = outs[-1].num_cached_tokens
                for c in outs[-1].outputs:
                    i = c.index
                    if done[i] or not (c.delta_token_ids or c.delta_text or c.finish_reason):
                        continue
                    tokens[i] += len(c.delta_token_ids)
                    if reasoning is not None:
                        output_ids[i].extend(c.delta_token_ids)
                    done[i] = c.finish_reason is not None
                    delta = texts[i].delta(c.delta_text, done[i])
                    finish = c.finish_reason
                    if finish is not None and texts[i].num_calls:
                        finish = _tool_finish(finish)
                    events.append(
                        chunk(
                            ChatChunkChoice(
                                index=i,
                                delta=delta,
                                logprobs=chat_logprobs(
                                    self.token_str, c.delta_token_ids, c.delta_logprobs, num_top
                                ),
                                finish_reason=finish,
                                stop_reason=c.stop_reason,
                                token_ids=list(c.delta_token_ids) if prompt_ids else None,
                            )
                        )
                    )
                if events:
                    yield "".join(events)
        except RequestAborted as exc:  # shutdown ran out of time: an error event, not "abort"
            yield sse_error(APIError(503, str(exc), type="service_unavailable"))
            yield SSE_DONE
            return
        except Exception as exc:  # engine failure: tell the client in-band, then end
            yield sse_error(APIError(500, f"engine error: {exc}", type="server_error"))
            yield SSE_DONE
            return
        if include_usage:
            yield sse(
                ChatCompletionChunk(
                    id=api_id,
                    created=created,
                    model=model,
                    choices=[],
                    usage=usage_now(),
                ).model_dump_json()
            )
        yield SSE_DONE


def _tool_finish(finish: str | None) -> str | None:
    return "tool_calls" if finish == "stop" else finish
