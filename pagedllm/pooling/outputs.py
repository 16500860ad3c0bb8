"""vLLM's pooling output classes: what `LLM.encode / embed / classify / score` return.

PoolingRequestOutput[PoolingOutput]       .outputs.data       (LLM.encode)
EmbeddingRequestOutput                    .outputs.embedding  (LLM.embed)
ClassificationRequestOutput               .outputs.probs      (LLM.classify)
ScoringRequestOutput                      .outputs.score      (LLM.score)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import torch


@dataclass
class PoolingOutput:
    """The pooled vector of one prompt (CPU float32)."""

    data: torch.Tensor


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class ClassificationOutput:
    probs: list[float]

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ScoringOutput:
    score: float


_O = TypeVar("_O")


@dataclass
class PoolingRequestOutput(Generic[_O]):
    """One pooling request's result; `error` is set when the engine failed it."""

    request_id: str
    outputs: _O
    prompt_token_ids: list[int]
    finished: bool = True
    num_cached_tokens: int = 0
    error: BaseException | None = None


@dataclass
class EmbeddingRequestOutput(PoolingRequestOutput[EmbeddingOutput]):
    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> EmbeddingRequestOutput:
        return cls(
            out.request_id,
            EmbeddingOutput(out.outputs.data.tolist()),
            out.prompt_token_ids,
            out.finished,
            out.num_cached_tokens,
        )


@dataclass
class ClassificationRequestOutput(PoolingRequestOutput[ClassificationOutput]):
    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> ClassificationRequestOutput:
        return cls(
            out.request_id,
            ClassificationOutput(out.outputs.data.tolist()),
            out.prompt_token_ids,
            out.finished,
            out.num_cached_tokens,
        )


@dataclass
class ScoringRequestOutput(PoolingRequestOutput[ScoringOutput]):
    @classmethod
    def from_base(cls, out: PoolingRequestOutput) -> ScoringRequestOutput:
        """A cross-encoder's output: its single (activated) logit is the score."""
        return cls(
            out.request_id,
            ScoringOutput(float(out.outputs.data.reshape(-1)[0])),
            out.prompt_token_ids,
            out.finished,
            out.num_cached_tokens,
        )
