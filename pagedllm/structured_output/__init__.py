"""Constrained decoding (JSON schema, regex, choice, grammar) with llguidance.

`params` (no backend import) is what SamplingParams uses; `manager` is what the engine uses.
"""

from pagedllm.structured_output.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
