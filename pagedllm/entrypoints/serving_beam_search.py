"""/v1/completions with `use_beam_search` (vLLM's extra): `n` beams per prompt, best first.

vLLM's request fields: `use_beam_search`, `n` (the beam width and the choices returned per
prompt), `length_penalty`, `early_stopping` (HF's True / False / "never"), `max_tokens`,
`ignore_eos`, plus `echo`, `logprobs` and `return_token_ids` in their usual shapes. The search
is pagedllm/beam_search.py's; each step submits every live beam as a one-token engine request
(prompt = the beam's tokens, the top 2n logprobs), so the beams' common prefix KV comes from
the prefix cache, as in `LLM.beam_search` (engine/beam_search_loop.py).

Refused with a 400 naming the field: `stream` (the best beams are known only at the end), a
temperature other than 0, and every sampling control the search cannot honour (it ranks the
raw logprobs): top_p / top_k / min_p, penalties, stop, min_tokens, logit_bias, token
restrictions, structured output, prompt_logprobs, echo together with logprobs.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.responses import JSONResponse, Response

from pagedllm.beam_search import (
    BeamSearchInstance,
    BeamSearchParams,
    BeamSearchSequence,
    InvalidBeamSearchParams,
)
from pagedllm.engine.async_engine import EngineRequest, RequestAborted
from pagedllm.engine.beam_search_loop import check_beam_width, step_params
from pagedllm.entrypoints.completion_logprobs import legacy_logprobs
from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.protocol import CompletionRequest
from pagedllm.entrypoints.protocol_responses import CompletionChoice, CompletionResponse
from pagedllm.entrypoints.request_fields import check_request_fields, structured_outputs_of
from pagedllm.entrypoints.serving import make_usage
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import Logprob

# field -> the values beam search accepts (what the client sends when it does not use it)
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "temperature": (None, 0.0),
    "top_p": (None, 1.0),
    "top_k": (None, 0, -1),
    "min_p": (None, 0.0),
    "presence_penalty": (0.0,),
    "frequency_penalty": (0.0,),
    "repetition_penalty": (None, 1.0),
    "stop": (None, []),
    "stop_token_ids": (None, []),
    "min_tokens": (0,),
    "logit_bias": (None, {}),
    "allowed_token_ids": (None,),
    "bad_words": (None, []),
    "prompt_logprobs": (None,),
}
_CONSTRAINTS = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


def check_beam_search_request(req: CompletionRequest) -> None:
    """400 for a field that beam search cannot honour (see the module doc)."""
    check_request_fields(req)
    if req.stream:
        raise APIError(
            400,
            "stream is not supported with use_beam_search (the best beams are "
            "known only when the search ends)",
            param="stream",
        )
    for name, neutral in _NEUTRAL.items():
        value = getattr(req, name)
        if value not in neutral:
            raise APIError(
                400,
                f"{name}={value!r} is not supported with use_beam_search "
                "(the search ranks the raw logprobs of every beam)",
                param=name,
            )
    if structured_outputs_of(req) is not None:
        param = next(n for n in _CONSTRAINTS if getattr(req, n) is not None)
        raise APIError(400, "structured output is not supported with use_beam_search", param=param)
    if req.logprobs is not None and req.logprobs < 0:
        raise APIError(400, f"logprobs must be >= 0, got {req.logprobs}", param="logprobs")
    if req.echo and req.logprobs is not None:
        raise APIError(
            400,
            "echo with logprobs is not supported with use_beam_search (the prompt is not scored)",
            param="echo",
        )


def beam_search_params(req: CompletionRequest, max_tokens: int) -> BeamSearchParams:
    """The request's BeamSearchParams (beam_width = n); a bad value is a 400 naming its field."""
    try:
        return BeamSearchParams(
            beam_width=req.n,
            max_tokens=max_tokens,
            ignore_eos=req.ignore_eos,
            length_penalty=req.length_penalty,
            early_stopping=req.early_stopping,
        )
    except InvalidBeamSearchParams as exc:
        param = str(exc).split(" ", 1)[0]
        raise APIError(
            400, str(exc).replace("beam_width", "n"), param="n" if param == "beam_width" else param
        ) from exc


class BeamSearchCompletion:
    """The beam-search path of OpenAIServingCompletion (a mixin over its ServingBase)."""

    async def _beam_search(
        self, req: CompletionRequest, lora: LoRARequest | None, header_id: str | None
    ) -> Response:
        check_beam_search_request(req)
        api_id, echoed_id = self.request_id("cmpl", req, header_id)
        prompts = await self._prompts(req)
        instances = []
        for _, ids in prompts:
            self.check_length(len(ids), req.max_tokens, "prompt")
            budget = self.max_model_len - len(ids) if req.max_tokens is None else req.max_tokens
            params = beam_search_params(req, budget)
            try:
                check_beam_width(params, self.max_logprobs)
            except InvalidBeamSearchParams as exc:
                raise APIError(400, str(exc).replace("beam_width", "n"), param="n") from exc
            instances.append(BeamSearchInstance(ids, params, self.engine.engine.eos_token_id))
        sampling = step_params(instances[0].params, req.logprobs)
        step = 0
        while live := [inst for inst in instances if not inst.done]:
            beams = [(inst, beam) for inst in live for beam in inst.beams]
            now = time.monotonic()
            requests = [
                EngineRequest(
                    f"{api_id}-{step}-{j}",
                    beam.tokens,
                    sampling,
                    now,
                    cache_salt=req.cache_salt,
                    lora_request=lora,
                    priority=req.priority,
                )
                for j, (_, beam) in enumerate(beams)
            ]
            rows = await self._step_logprobs(requests, log=step == 0)
            for inst in live:
                inst.advance([row for (i, _), row in zip(beams, rows, strict=True) if i is inst])
            step += 1
        body = self._beam_response(req, self.response_model(lora), api_id, prompts, instances)
        return JSONResponse(body, headers={"X-Request-Id": echoed_id})

    async def _step_logprobs(
        self, requests: list[EngineRequest], log: bool
    ) -> list[dict[int, Logprob]]:
        """Run one step's requests (logged for the first step only); the next-token logprobs
        of each, in order."""
        stream = await self.submit(requests, log=log)
        final = {}
        try:
            async for outs in stream:
                for out in outs:
                    final[out.request_id] = out
        except RequestAborted as exc:
            raise APIError(503, str(exc), type="service_unavailable") from exc
        finally:
            stream.abort()
        return [final[r.request_id].outputs[0].logprobs[0] for r in requests]

    def _beam_response(
        self,
        req: CompletionRequest,
        model: str,
        api_id: str,
        prompts: list[tuple[str | None, list[int]]],
        instances: list[BeamSearchInstance],
    ) -> dict:
        choices, num_completion = [], 0
        for p, ((text, ids), inst) in enumerate(zip(prompts, instances, strict=True)):
            echo = (text if text is not None else self.tokenizer.decode(ids)) if req.echo else ""
            for j, seq in enumerate(inst.output().sequences):
                out_ids = seq.tokens[len(ids) :]
                num_completion += len(out_ids)
                choices.append(
                    CompletionChoice(
                        index=p * req.n + j,
                        text=echo + self._beam_text(req, seq, out_ids),
                        logprobs=self._beam_logprobs(req, out_ids, seq, len(echo)),
                        finish_reason=seq.finish_reason,
                        prompt_token_ids=ids if req.return_token_ids else None,
                        token_ids=out_ids if req.return_token_ids else None,
                    )
                )
        usage = make_usage(sum(len(ids) for _, ids in prompts), num_completion, 0)
        return CompletionResponse(id=api_id, model=model, choices=choices, usage=usage).model_dump()

    def _beam_text(
        self, req: CompletionRequest, seq: BeamSearchSequence, out_ids: list[int]
    ) -> str:
        """The generated text; a final EOS is left out (vLLM's)."""
        if seq.finish_reason == "stop":
            out_ids = out_ids[:-1]
        return self.tokenizer.decode(out_ids, skip_special_tokens=req.skip_special_tokens)

    def _beam_logprobs(
        self, req: CompletionRequest, out_ids: list[int], seq: BeamSearchSequence, offset: int
    ):
        if req.logprobs is None:
            return None
        # each entry is the parent's step: put the token this beam took first (the shape's
        # "the token itself, then the most likely")
        entries = [{tok: row[tok], **row} for tok, row in zip(out_ids, seq.logprobs, strict=True)]
        return legacy_logprobs(out_ids, entries, req.logprobs, offset, self.token_str)[0]
