"""pagedllm: LLM inference and serving with a paged KV cache and continuous batching."""

from pagedllm.engine.llm import LLM
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.outputs import CompletionOutput, Logprob, RequestOutput
from pagedllm.sampling_params import SamplingParams, StructuredOutputsParams

__version__ = "0.1.0"
__all__ = ["LLM", "LLMEngine", "SamplingParams", "StructuredOutputsParams", "RequestOutput",
           "CompletionOutput", "Logprob"]
