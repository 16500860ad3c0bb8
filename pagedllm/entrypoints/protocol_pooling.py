"""Request and response models of the pooling routes (vLLM's shapes):

    POST /v1/embeddings   EmbeddingRequest -> EmbeddingResponse  (OpenAI's, + vLLM's normalize)
    POST /pooling         PoolingRequest   -> PoolingResponse    (vLLM's: the model's output)
    POST /classify        ClassificationRequest -> ClassificationResponse  (vLLM's)
    POST /score           ScoreRequest     -> ScoreResponse      (vLLM's text_1 / text_2)
    POST /rerank, /v1/rerank  RerankRequest -> RerankResponse    (Jina / Cohere shape)

Fields of vLLM's API that are not implemented are declared in `UNSUPPORTED` with their
neutral value: any other value is a 400 naming the field (request_fields.py).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from pagedllm.entrypoints.protocol import ChatMessage, OpenAIBaseModel, RequestBody
from pagedllm.entrypoints.protocol_responses import UsageInfo

# str | list[str] | list[int] | list[list[int]], as OpenAI's embeddings `input`.
EmbeddingInput = str | list[str] | list[int] | list[list[int]]

_UNSUPPORTED = {"messages": None, "mm_processor_kwargs": None}


class PoolingFields(RequestBody):
    """What every pooling route takes besides its input."""

    UNSUPPORTED: ClassVar[dict] = _UNSUPPORTED
    model: str | None = None
    user: str | None = None  # OpenAI's end-user id: accepted, not used
    request_id: str | None = None
    priority: int = 0
    truncate_prompt_tokens: int | None = None  # keep the last k tokens (-1: max_model_len)
    messages: list | None = None
    mm_processor_kwargs: dict | None = None


class EmbeddingRequest(PoolingFields):
    """`input`, or vLLM's chat embeddings: `messages` rendered by the chat template (no
    generation prompt by default)."""

    UNSUPPORTED: ClassVar[dict] = {"mm_processor_kwargs": None}
    input: EmbeddingInput | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    normalize: bool | None = None  # vLLM's: None = the model's pooler config
    add_special_tokens: bool = True


class PoolingRequest(EmbeddingRequest):
    """vLLM's /pooling: the model's own output (an embedding, or class probabilities)."""

    activation: bool | None = None


class ClassificationRequest(PoolingFields):
    """vLLM's /classify: class probabilities of each input."""

    input: EmbeddingInput
    activation: bool | None = None
    add_special_tokens: bool = True


class ScoreRequest(PoolingFields):
    text_1: str | list[str]
    text_2: str | list[str]
    activation: bool | None = None


class RerankRequest(PoolingFields):
    query: str
    documents: list[str]
    top_n: int = Field(default=0, ge=0)  # 0: every document (vLLM's)
    return_documents: bool = True
    activation: bool | None = None


class EmbeddingData(OpenAIBaseModel):
    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str


class EmbeddingResponse(OpenAIBaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[EmbeddingData]
    usage: UsageInfo


class PoolingData(OpenAIBaseModel):
    index: int
    object: Literal["pooling"] = "pooling"
    data: list[float] | list[list[float]] | str  # per token with ALL pooling


class PoolingResponse(OpenAIBaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: UsageInfo


class ClassificationData(OpenAIBaseModel):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(OpenAIBaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


class ScoreData(OpenAIBaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(OpenAIBaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: UsageInfo


class RerankDocument(OpenAIBaseModel):
    text: str


class RerankResult(OpenAIBaseModel):
    index: int
    document: RerankDocument | None = None
    relevance_score: float


class RerankUsage(OpenAIBaseModel):
    total_tokens: int


class RerankResponse(OpenAIBaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
