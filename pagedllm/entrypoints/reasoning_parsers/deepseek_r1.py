"""DeepSeek-R1 and its distills: the chat template opens `<think>\n` in the prompt, the output
is thinking up to `</think>`, then the answer. As vLLM, the output is taken to start inside
the thinking whatever the prompt shows (early R1 builds wrote `<think>` themselves: dropped),
and thinking that never closes is all reasoning."""

from __future__ import annotations

from pagedllm.entrypoints.reasoning_parsers.base import (
    ReasoningParser,
    register_reasoning_parser,
)


@register_reasoning_parser
class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
    always_thinking = True
