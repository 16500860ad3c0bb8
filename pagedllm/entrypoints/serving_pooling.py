"""The pooling routes of a `--runner pooling` server (vLLM's): /v1/embeddings, /pooling,
/classify, /score, /rerank and /v1/rerank. Each input becomes one pooling request
(PoolingParams) through the same AsyncEngine as generation; the finished
PoolingRequestOutputs are shaped here.

On a server that generates, these routes answer 400 naming the runner; the generation routes
of a pooling server answer 400 from the engine's intake ("does not generate text").
"""

from __future__ import annotations

import asyncio
import base64
import time

import torch
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse

from pagedllm.engine.async_engine import EngineRequest, RequestAborted
from pagedllm.engine.llm_pooling import pair_prompt, score_pairs
from pagedllm.entrypoints.disconnect import with_disconnect
from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.openapi_spec import POST_ERRORS
from pagedllm.entrypoints.protocol_pooling import (
    ClassificationData,
    ClassificationRequest,
    ClassificationResponse,
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingData,
    PoolingFields,
    PoolingRequest,
    PoolingResponse,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from pagedllm.entrypoints.protocol_responses import UsageInfo
from pagedllm.entrypoints.request_fields import check_request_fields
from pagedllm.entrypoints.serving import ServingBase
from pagedllm.pooling.outputs import PoolingRequestOutput
from pagedllm.pooling.setup import PoolingSetup
from pagedllm.pooling_params import PoolingParams


def encode_vector(data: torch.Tensor, encoding_format: str) -> list[float] | str:
    """A vector as floats, or OpenAI's base64 (little-endian float32 bytes)."""
    if encoding_format == "base64":
        return base64.b64encode(data.to(torch.float32).numpy().astype("<f4").tobytes()).decode()
    return data.tolist()


class OpenAIServingPooling(ServingBase):
    """Embeddings, pooling, score and rerank over the engine's pooling model."""

    def setup(self, route: str) -> PoolingSetup:
        """The engine's pooling setup; 400 naming the runner on a server that generates."""
        setup = getattr(self.engine.engine, "pooling", None)
        if setup is None:
            raise APIError(
                400,
                f"{route} needs a pooling model; this server runs "
                "--runner generate (serve an embedding or classification model "
                "with --runner pooling)",
            )
        return setup

    async def prompts(
        self, inp, add_special_tokens: bool, truncate: int | None = None
    ) -> list[list[int]]:
        """Token ids of each input: a string, strings, token ids or lists of token ids; with
        `truncate` (vLLM's truncate_prompt_tokens) the last k tokens of each (-1: of
        max_model_len), so a longer text is not refused for its size."""
        items = [inp] if isinstance(inp, str) or (inp and isinstance(inp[0], int)) else inp
        if not items:
            raise APIError(400, "input must not be empty", param="input")
        ids = []
        for item in items:
            if isinstance(item, str) and truncate is None:
                item = await self.encode(item, add_special_tokens, param="input")
            elif isinstance(item, str):  # the body limit bounds it; cut below
                item = await asyncio.to_thread(
                    self.tokenizer.encode, item, add_special_tokens=add_special_tokens
                )
            if truncate is not None:
                item = item[-(self.max_model_len if truncate == -1 else truncate) :]
            self.check_token_ids(item, "input")
            self.check_pooled_length(len(item), "input")
            ids.append(list(item))
        return ids

    async def inputs_of(self, req: EmbeddingRequest) -> list[list[int]]:
        """Token ids of an embeddings / pooling request: its `input`, or its `messages`
        rendered by the chat template (vLLM's chat embeddings)."""
        if (req.input is None) == (req.messages is None):
            raise APIError(400, "give either input or messages", param="input")
        k = req.truncate_prompt_tokens
        if req.messages is None:
            return await self.prompts(req.input, req.add_special_tokens, k)
        ids = await self.apply_chat_template(
            req.messages,
            req.add_generation_prompt,
            chat_template=req.chat_template,
            chat_template_kwargs=req.chat_template_kwargs,
        )
        return await self.prompts([ids], req.add_special_tokens, k)

    def check_pooled_length(self, num_prompt: int, param: str) -> None:
        """A pooled prompt may fill max_model_len (nothing is generated after it)."""
        if num_prompt == 0:
            raise APIError(400, f"{param} must not be empty", param=param)
        if num_prompt > self.max_model_len:
            raise APIError(
                400,
                f"{param} has {num_prompt} tokens, max_model_len is {self.max_model_len}",
                param=param,
                code="context_length_exceeded",
            )

    async def pool(
        self,
        prefix: str,
        req: PoolingFields,
        header: str | None,
        prompts: list[list[int]],
        params: PoolingParams,
    ) -> tuple[str, list[PoolingRequestOutput]]:
        """Run every prompt as a pooling request; (API id, outputs in input order)."""
        check_request_fields(req)
        lora = self.check_model(req.model)
        api_id, _ = self.request_id(prefix, req, header)
        reqs = [
            EngineRequest(f"{api_id}-{i}", p, params, lora_request=lora, priority=req.priority)
            for i, p in enumerate(prompts)
        ]
        stream = await self.submit(reqs)
        final: dict[str, PoolingRequestOutput] = {}
        try:
            async for outs in stream:
                for out in outs:
                    final[out.request_id] = out
        except RequestAborted as exc:
            raise APIError(503, str(exc), type="service_unavailable") from exc
        finally:
            stream.abort()
        return api_id, [final[r.request_id] for r in reqs]

    @staticmethod
    def usage(outs: list[PoolingRequestOutput]) -> UsageInfo:
        n = sum(len(o.prompt_token_ids) for o in outs)
        return UsageInfo(prompt_tokens=n, total_tokens=n)

    # ---------------------------------------------------------------- routes
    async def embeddings(self, req: EmbeddingRequest, header: str | None) -> dict:
        self.setup("/v1/embeddings")
        params = pooling_params(
            task="embed",
            dimensions=req.dimensions,
            normalize=req.normalize,
            truncate_prompt_tokens=req.truncate_prompt_tokens,
        )
        return await self._vectors("embd", req, header, params, EmbeddingResponse,
                                   lambda i, v: EmbeddingData(index=i, embedding=v))

    async def pooling(self, req: PoolingRequest, header: str | None) -> dict:
        self.setup("/pooling")
        params = pooling_params(
            task="encode",
            dimensions=req.dimensions,
            normalize=req.normalize,
            activation=req.activation,
            truncate_prompt_tokens=req.truncate_prompt_tokens,
        )
        return await self._vectors("pool", req, header, params, PoolingResponse,
                                   lambda i, v: PoolingData(index=i, data=v))

    async def _vectors(self, prefix: str, req, header: str | None, params, response_cls,
                       item) -> dict:
        """/v1/embeddings and /pooling after their parameters: pool the request's inputs and
        answer one encoded vector per prompt (`item(index, vector)`) with usage."""
        prompts = await self.inputs_of(req)
        api_id, outs = await self.pool(prefix, req, header, prompts, params)
        data = [item(i, encode_vector(o.outputs.data, req.encoding_format))
                for i, o in enumerate(outs)]
        return response_cls(
            id=api_id,
            created=int(time.time()),
            model=self.response_model(self.check_model(req.model)),
            data=data,
            usage=self.usage(outs),
        ).model_dump()

    async def classify(self, req: ClassificationRequest, header: str | None) -> dict:
        setup = self.setup("/classify")
        params = pooling_params(
            task="classify",
            activation=req.activation,
            truncate_prompt_tokens=req.truncate_prompt_tokens,
        )
        prompts = await self.prompts(req.input, req.add_special_tokens, req.truncate_prompt_tokens)
        api_id, outs = await self.pool("classify", req, header, prompts, params)
        data = []
        for i, o in enumerate(outs):
            probs = o.outputs.data.tolist()
            best = max(range(len(probs)), key=probs.__getitem__)
            data.append(
                ClassificationData(
                    index=i,
                    probs=probs,
                    num_classes=len(probs),
                    label=setup.labels[best] if setup.labels else None,
                )
            )
        return ClassificationResponse(
            id=api_id,
            created=int(time.time()),
            model=self.response_model(self.check_model(req.model)),
            data=data,
            usage=self.usage(outs),
        ).model_dump()

    async def scores(
        self, req: ScoreRequest | RerankRequest, first, second, header: str | None, prefix: str
    ) -> tuple[str, list[float], UsageInfo]:
        """One score per (first, second) pair: a cross-encoder reads the pair joined by its
        tokenizer; an embedding model compares the two embeddings (cosine)."""
        setup = self.setup(f"/{prefix}")
        try:
            pairs = score_pairs(first, second)
        except ValueError as exc:
            raise APIError(400, str(exc)) from None
        k = req.truncate_prompt_tokens
        embed = setup.task == "embed"
        params = pooling_params(  # first: a bad truncate_prompt_tokens is a 400 here
            task="embed" if embed else "score",
            activation=req.activation,
            truncate_prompt_tokens=k,
        )
        for a, b in pairs:
            if k is None:
                self.inputs.check_size(len(a.encode("utf-8")) + len(b.encode("utf-8")), "input")
        if embed:
            texts = list(dict.fromkeys(t for pair in pairs for t in pair))
            prompts = await self.prompts(texts, True, k)
            api_id, outs = await self.pool(prefix, req, header, prompts, params)
            vec = {t: o.outputs.data for t, o in zip(texts, outs, strict=True)}
            values = [
                torch.nn.functional.cosine_similarity(vec[a], vec[b], dim=0).item()
                for a, b in pairs
            ]
            return api_id, values, self.usage(outs)
        tok, limit = self.tokenizer, self.max_model_len
        prompts = [
            (await asyncio.to_thread(pair_prompt, tok, a, b, k, limit))["prompt_token_ids"]
            for a, b in pairs
        ]
        for p in prompts:
            self.check_pooled_length(len(p), "input")
        api_id, outs = await self.pool(prefix, req, header, prompts, params)
        return api_id, [float(o.outputs.data.reshape(-1)[0]) for o in outs], self.usage(outs)

    async def score(self, req: ScoreRequest, header: str | None) -> dict:
        api_id, values, usage = await self.scores(req, req.text_1, req.text_2, header, "score")
        return ScoreResponse(
            id=api_id,
            created=int(time.time()),
            model=self.response_model(self.check_model(req.model)),
            data=[ScoreData(index=i, score=s) for i, s in enumerate(values)],
            usage=usage,
        ).model_dump()

    async def rerank(self, req: RerankRequest, header: str | None) -> dict:
        if not req.documents:
            raise APIError(400, "documents must not be empty", param="documents")
        api_id, values, usage = await self.scores(req, req.query, req.documents, header, "rerank")
        order = sorted(range(len(values)), key=lambda i: -values[i])
        if req.top_n:
            order = order[: req.top_n]
        results = [
            RerankResult(
                index=i,
                relevance_score=values[i],
                document=(RerankDocument(text=req.documents[i]) if req.return_documents else None),
            )
            for i in order
        ]
        return RerankResponse(
            id=api_id,
            model=self.response_model(self.check_model(req.model)),
            usage=RerankUsage(total_tokens=usage.prompt_tokens),
            results=results,
        ).model_dump()


def pooling_params(**fields) -> PoolingParams:
    """PoolingParams of a request's fields; a bad value is a 400."""
    try:
        return PoolingParams(**fields)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def add_pooling_routes(app: FastAPI, serving: OpenAIServingPooling) -> None:
    """Register the pooling routes (see the module doc); a client that hangs up aborts its
    requests (with_disconnect), as on the generation routes."""

    def header(request: Request) -> str | None:
        return request.headers.get("x-request-id")

    async def _json(work, body, request: Request) -> JSONResponse:
        """The answer, its X-Request-Id the client's id (header, else request_id) or ours,
        as on the generation routes."""
        result = await work
        given = header(request)
        given = given if given is not None else body.request_id
        return JSONResponse(result, headers={"X-Request-Id": given or result["id"]})

    @app.post("/v1/embeddings", responses=POST_ERRORS)
    async def create_embedding(body: EmbeddingRequest, request: Request) -> JSONResponse:
        return await with_disconnect(
            request, _json(serving.embeddings(body, header(request)), body, request)
        )

    @app.post("/pooling", responses=POST_ERRORS)
    async def create_pooling(body: PoolingRequest, request: Request) -> JSONResponse:
        return await with_disconnect(
            request, _json(serving.pooling(body, header(request)), body, request)
        )

    @app.post("/classify", responses=POST_ERRORS)
    async def create_classification(body: ClassificationRequest, request: Request) -> JSONResponse:
        return await with_disconnect(
            request, _json(serving.classify(body, header(request)), body, request)
        )

    @app.post("/score", responses=POST_ERRORS)
    @app.post("/v1/score", responses=POST_ERRORS)
    async def create_score(body: ScoreRequest, request: Request) -> JSONResponse:
        return await with_disconnect(
            request, _json(serving.score(body, header(request)), body, request)
        )

    @app.post("/rerank", responses=POST_ERRORS)
    @app.post("/v1/rerank", responses=POST_ERRORS)
    @app.post("/v2/rerank", responses=POST_ERRORS)
    async def create_rerank(body: RerankRequest, request: Request) -> JSONResponse:
        return await with_disconnect(
            request, _json(serving.rerank(body, header(request)), body, request)
        )
