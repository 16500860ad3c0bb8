"""/v1/completions: prompts (string, strings, token ids, lists of token ids) x n choices.

Prompt p's sample i is choice `p * n + i`. Streaming sends one event per engine step with the
choices that gained tokens; each choice's finish_reason appears in its last chunk only.

`echo` puts the prompt before the completion; with `logprobs` the prompt tokens are scored
too (vLLM's rule: prompt_logprobs = logprobs unless given), in the legacy logprobs shape
(completion_logprobs.py). `echo` with `max_tokens=0` only scores the prompt: the engine
samples one token to end the request, and the response leaves it out (vLLM's).
`use_beam_search` takes its own path (serving_beam_search.py).
"""

from __future__ import annotations

import asyncio
import time

from starlette.responses import JSONResponse, Response

from pagedllm.engine.async_engine import EngineRequest, RequestAborted, RequestStream
from pagedllm.entrypoints.chat_options import ChatOptions
from pagedllm.entrypoints.completion_logprobs import legacy_logprobs, prompt_logprobs_json
from pagedllm.entrypoints.protocol import (
    CompletionRequest,
)
from pagedllm.entrypoints.protocol_responses import (
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionResponse,
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
from pagedllm.entrypoints.serving_beam_search import BeamSearchCompletion
from pagedllm.entrypoints.tool_calls import strict_response_format
from pagedllm.outputs import RequestOutput, SampleLogprobs


class OpenAIServingCompletion(BeamSearchCompletion, ServingBase):
    def __init__(self, engine, served_model_names: list[str], models=None, *,
                 chat_options: ChatOptions | None = None, **shared) -> None:
        super().__init__(engine, served_model_names, models, **shared)
        # --structured-outputs-config: strict json_schema response formats, as on chat
        self.chat_options = chat_options or ChatOptions()

    async def _prompts(self, req: CompletionRequest) -> list[tuple[str | None, list[int]]]:
        """(text or None, token ids) per prompt; at most --max-prompts-per-request."""
        p = req.prompt
        if isinstance(p, str):
            items: list = [p]
        elif not p:
            raise APIError(400, "prompt must not be empty", param="prompt")
        elif all(isinstance(t, int) for t in p):
            items = [p]
        else:
            items = list(p)
        limit = self.options.max_prompts_per_request
        if len(items) > limit:
            raise APIError(400, f"prompt holds {len(items)} prompts, the limit is {limit} per "
                           "request (--max-prompts-per-request)", param="prompt",
                           code="too_many_prompts")
        texts = [item for item in items if isinstance(item, str)]
        encoded = iter(await self.encode_many(texts) if texts else [])
        out = []
        for item in items:
            if isinstance(item, str):
                out.append((item, next(encoded)))
            else:
                self.check_token_ids(item, "prompt")
                out.append((None, list(item)))
        return out

    async def create(self, req: CompletionRequest, header_id: str | None = None) -> Response:
        lora = self.check_model(req.model)
        if req.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of is not supported (it must equal n)", param="best_of")
        if req.use_beam_search:
            return await self._beam_search(req, lora, header_id)
        score_only = req.echo and req.max_tokens == 0
        params = self.sampling_params(
            req, 1 if score_only else req.max_tokens, req.logprobs,
            strict_response_format(req, self.chat_options),
            prompt_logprobs=req.logprobs if req.echo and req.prompt_logprobs is None else None)
        api_id, echoed_id = self.request_id("cmpl", req, header_id)
        prompts = await self._prompts(req)
        for _, ids in prompts:
            self.check_length(len(ids), req.max_tokens, "prompt")
        now = time.monotonic()

        def engine_requests() -> list[EngineRequest]:
            return [EngineRequest(f"{api_id}-{i}", ids, params.clone() if i else params, now,
                                  cache_salt=req.cache_salt, lora_request=lora,
                                  priority=req.priority)
                    for i, (_, ids) in enumerate(prompts)]

        # A params copy per prompt is ~40 us: 20,000 of them off the event loop.
        requests = (engine_requests() if len(prompts) == 1
                    else await asyncio.to_thread(engine_requests))
        stream = await self.submit(requests)
        echo = [(t if t is not None else self.tokenizer.decode(ids)) if req.echo else ""
                for t, ids in prompts]
        prompt_ids = [ids for _, ids in prompts] if req.return_token_ids else None
        num_prompt = sum(len(ids) for _, ids in prompts)
        headers = {"X-Request-Id": echoed_id}
        model = self.response_model(lora)
        if req.stream:
            gen = self._stream(req, model, api_id, stream, echo, num_prompt, prompt_ids)
            return SSEResponse(gen, on_close=stream.abort, headers=headers)
        try:
            return JSONResponse(await self._full(req, model, api_id, stream, echo, num_prompt,
                                                 prompt_ids), headers=headers)
        finally:
            stream.abort()

    def _logprobs(self, req: CompletionRequest, token_ids: list[int],
                  logprobs: SampleLogprobs | None, offset: int
                  ) -> tuple[CompletionLogprobs | None, int]:
        """OpenAI's completions shape; `offset` is where the first token starts in the text."""
        if logprobs is None or req.logprobs is None:
            return None, offset
        return legacy_logprobs(token_ids, logprobs, req.logprobs, offset, self.token_str)

    def _echo_logprobs(self, req: CompletionRequest, prompt: list[int], out: RequestOutput
                       ) -> tuple[CompletionLogprobs | None, int]:
        """The prompt tokens' part of an echoed choice's logprobs (None without logprobs)."""
        if req.logprobs is None or not req.echo:
            return None, 0
        entries = out.prompt_logprobs or [None] * len(prompt)  # None: the request failed
        return legacy_logprobs(prompt, entries, req.logprobs, 0, self.token_str)

    async def _full(self, req: CompletionRequest, model: str, api_id: str,
                    stream: RequestStream, echo: list[str], num_prompt: int,
                    prompt_ids: list[list[int]] | None) -> dict:
        final: dict[str, RequestOutput] = {}
        try:
            async for outs in stream:
                for out in outs:
                    final[out.request_id] = out
        except RequestAborted as exc:
            raise APIError(503, str(exc), type="service_unavailable") from exc
        choices, completion_tokens = [], 0
        score_only = req.echo and req.max_tokens == 0
        for p, rid in enumerate(stream.request_ids):
            out = final[rid]
            head, offset = self._echo_logprobs(req, out.prompt_token_ids, out)
            for c in out.outputs:
                ids, lps, text = ([], [], "") if score_only else (c.token_ids, c.logprobs, c.text)
                completion_tokens += len(ids)
                lp, _ = self._logprobs(req, ids, lps,
                                       offset if head is not None else len(echo[p]))
                if head is not None:
                    lp = _joined(head, lp)
                choices.append(CompletionChoice(
                    index=p * req.n + c.index, text=echo[p] + text, logprobs=lp,
                    finish_reason=c.finish_reason, stop_reason=None if score_only else
                    c.stop_reason, prompt_token_ids=prompt_ids[p] if prompt_ids else None,
                    token_ids=list(ids) if prompt_ids else None,
                    prompt_logprobs=prompt_logprobs_json(out.prompt_logprobs)))
        usage = make_usage(num_prompt, completion_tokens,
                           sum(final[rid].num_cached_tokens for rid in stream.request_ids))
        return CompletionResponse(id=api_id, model=model, choices=choices,
                                  usage=usage).model_dump()

    async def _stream(self, req: CompletionRequest, model: str, api_id: str,
                      stream: RequestStream, echo: list[str], num_prompt: int,
                      prompt_ids: list[list[int]] | None):
        created, n = int(time.time()), req.n
        opts = req.stream_options
        include_usage = bool(opts and opts.include_usage)
        continuous = include_usage and bool(opts and opts.continuous_usage_stats)
        prompt_of = {rid: p for p, rid in enumerate(stream.request_ids)}
        num_choices = n * len(stream.request_ids)
        done = [False] * num_choices
        tokens = [0] * num_choices
        started = [False] * num_choices  # return_token_ids: prompt ids go in the first chunk
        cached: dict[str, int] = {}  # request id -> prompt tokens found in the prefix cache
        offset = [len(echo[i // n]) for i in range(num_choices)]
        score_only = req.echo and req.max_tokens == 0
        # echo + logprobs: the prompt goes out with its logprobs, in the first output
        late_echo = req.echo and req.logprobs is not None
        echoed: set[str] = set()

        def chunk(choices: list[CompletionChoice]) -> str:
            usage = (make_usage(num_prompt, sum(tokens), sum(cached.values()))
                     if continuous else None)
            return sse(CompletionChunk(id=api_id, created=created, model=model,
                                       choices=choices, usage=usage).model_dump_json())

        def first_ids(i: int) -> list[int] | None:
            if prompt_ids is None or started[i]:
                return None
            started[i] = True
            return prompt_ids[i // n]

        try:
            if req.echo and not late_echo:
                yield "".join(chunk([CompletionChoice(index=i, text=echo[i // n],
                                                      prompt_token_ids=first_ids(i))])
                              for i in range(num_choices))
            async for outs in stream:
                events = []
                for out in outs:
                    p = prompt_of[out.request_id]
                    cached[out.request_id] = out.num_cached_tokens
                    if late_echo and out.request_id not in echoed:
                        echoed.add(out.request_id)
                        head, end = self._echo_logprobs(req, out.prompt_token_ids, out)
                        for i in range(p * n, p * n + n):
                            offset[i] = end
                            events.append(chunk([CompletionChoice(
                                index=i, text=echo[p], logprobs=head,
                                prompt_token_ids=first_ids(i))]))
                    for c in out.outputs:
                        i = p * n + c.index
                        ids, lps, text = (([], [], "") if score_only else
                                          (c.delta_token_ids, c.delta_logprobs, c.delta_text))
                        if done[i] or not (ids or text or c.finish_reason):
                            continue
                        tokens[i] += len(ids)
                        done[i] = c.finish_reason is not None
                        lp, offset[i] = self._logprobs(req, ids, lps, offset[i])
                        events.append(chunk([CompletionChoice(
                            index=i, text=text, logprobs=lp, finish_reason=c.finish_reason,
                            stop_reason=None if score_only else c.stop_reason,
                            prompt_token_ids=first_ids(i),
                            token_ids=list(ids) if prompt_ids else None)]))
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
            yield sse(CompletionChunk(
                id=api_id, created=created, model=model, choices=[],
                usage=make_usage(num_prompt, sum(tokens), sum(cached.values()))
            ).model_dump_json())
        yield SSE_DONE


def _joined(head: CompletionLogprobs, tail: CompletionLogprobs | None) -> CompletionLogprobs:
    """An echoed choice's logprobs: the prompt's columns, then the completion's."""
    if tail is None:
        return head
    return CompletionLogprobs(tokens=head.tokens + tail.tokens,
                              token_logprobs=head.token_logprobs + tail.token_logprobs,
                              top_logprobs=head.top_logprobs + tail.top_logprobs,
                              text_offset=head.text_offset + tail.text_offset)
