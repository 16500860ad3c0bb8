"""Qwen3: thinking on by default; `chat_template_kwargs: {"enable_thinking": false}` turns it
off in the template (which then writes an empty `<think></think>` into the prompt) and here
(the whole output is content). With thinking on, the output opens `<think>` itself (hybrid
Qwen3) or the prompt already opened it (the 2507 thinking models); an output that opens no
thinking is all content."""

from __future__ import annotations

from pagedllm.entrypoints.reasoning_parsers.base import (
    ReasoningParser,
    register_reasoning_parser,
)


@register_reasoning_parser
class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"

    @classmethod
    def for_request(cls, prompt_tail: str, template_kwargs: dict | None) -> ReasoningParser | None:
        if (template_kwargs or {}).get("enable_thinking", True) is False:
            return None
        return cls(cls.prompt_opens_thinking(prompt_tail))
