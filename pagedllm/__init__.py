"""pagedllm: LLM inference and serving with a paged KV cache and continuous batching.

The public names are imported on first use (PEP 562), so that `import pagedllm` and the
`pagedllm` command's `--help` / `--version` do not pay for importing torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"
_EXPORTS = {
    "LLM": "pagedllm.engine.llm",
    "LLMEngine": "pagedllm.engine.llm_engine",
    "LoRARequest": "pagedllm.lora.request",
    "SamplingParams": "pagedllm.sampling_params",
    "StructuredOutputsParams": "pagedllm.sampling_params",
    "RequestOutput": "pagedllm.outputs",
    "CompletionOutput": "pagedllm.outputs",
    "Logprob": "pagedllm.outputs",
}
__all__ = [
    "LLM",
    "LLMEngine",
    "LoRARequest",
    "SamplingParams",
    "StructuredOutputsParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
]

if TYPE_CHECKING:
    from pagedllm.engine.llm import LLM
    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.lora.request import LoRARequest
    from pagedllm.outputs import CompletionOutput, Logprob, RequestOutput
    from pagedllm.sampling_params import SamplingParams, StructuredOutputsParams


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pagedllm' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
