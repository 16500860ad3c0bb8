"""pagedllm: LLM inference and serving with a paged KV cache and continuous batching.

The public names are imported on first use (PEP 562), so that `import pagedllm` and the
`pagedllm` command's `--help` / `--version` do not pay for importing torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedllm.lazy_exports import lazy_getattr

__version__ = "0.1.0"
_EXPORTS = {
    "LLM": "pagedllm.engine.llm",
    "LLMEngine": "pagedllm.engine.llm_engine",
    "LoRARequest": "pagedllm.lora.request",
    "SamplingParams": "pagedllm.sampling_params",
    "BeamSearchParams": "pagedllm.beam_search",
    "StructuredOutputsParams": "pagedllm.sampling_params",
    "RequestOutput": "pagedllm.outputs",
    "CompletionOutput": "pagedllm.outputs",
    "Logprob": "pagedllm.outputs",
    "PagedLLMError": "pagedllm.errors",
    "PoolingParams": "pagedllm.pooling_params",
    "PoolingRequestOutput": "pagedllm.pooling.outputs",
    "EmbeddingRequestOutput": "pagedllm.pooling.outputs",
    "ClassificationRequestOutput": "pagedllm.pooling.outputs",
    "ScoringRequestOutput": "pagedllm.pooling.outputs",
}
__all__ = [
    "LLM",
    "LLMEngine",
    "LoRARequest",
    "SamplingParams",
    "BeamSearchParams",
    "StructuredOutputsParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "PagedLLMError",
    "PoolingParams",
    "PoolingRequestOutput",
    "EmbeddingRequestOutput",
    "ClassificationRequestOutput",
    "ScoringRequestOutput",
]

if TYPE_CHECKING:
    from pagedllm.beam_search import BeamSearchParams
    from pagedllm.engine.llm import LLM
    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.errors import PagedLLMError
    from pagedllm.lora.request import LoRARequest
    from pagedllm.outputs import CompletionOutput, Logprob, RequestOutput
    from pagedllm.pooling.outputs import (
        ClassificationRequestOutput,
        EmbeddingRequestOutput,
        PoolingRequestOutput,
        ScoringRequestOutput,
    )
    from pagedllm.pooling_params import PoolingParams
    from pagedllm.sampling_params import SamplingParams, StructuredOutputsParams


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
