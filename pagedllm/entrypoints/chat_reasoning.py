"""Reasoning on /v1/chat/completions (`--reasoning-parser`): what a request's thinking needs.

    per request   plan_reasoning: the parser for this request (None: no thinking, e.g. Qwen3
                  with enable_thinking false), whether the prompt opened the thinking, and,
                  when the request has a grammar or a thinking_token_budget, the engine's
                  ThinkingParams (the grammar starts after `</think>`, the budget forces it)
    per choice    ReasoningPlan.parser(): text deltas -> (reasoning_content, content)
    usage         ReasoningPlan.reasoning_tokens(token_ids)

`reasoning_effort` is not the parser's: it reaches the chat template as a variable
(`reasoning_effort_kwargs`), as vLLM passes it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.protocol import ChatCompletionRequest
from pagedllm.entrypoints.reasoning_parsers import REASONING_PARSERS, ReasoningParser
from pagedllm.structured_output.thinking import ThinkingParams

PROMPT_TAIL_TOKENS = 64  # how much of the prompt is read to see whether it opened thinking


@dataclass
class ReasoningPlan:
    parser_cls: type[ReasoningParser]
    in_thinking: bool  # the output starts inside the thinking
    start_id: int | None  # the markers' token ids (None: not one token)
    end_id: int | None
    include: bool  # include_reasoning: send the reasoning text
    tokenizer: object = None  # for markers that are not one token (see reasoning_tokens)

    def parser(self) -> ReasoningParser:
        return self.parser_cls(self.in_thinking)

    def reasoning_tokens(self, token_ids: list[int]) -> int:
        """Output tokens inside the thinking (markers not counted). Markers that are not one
        token each (gpt-oss's channel header): the tokens of the reasoning text, re-encoded."""
        ids = list(token_ids)
        if (self.start_id is None or self.end_id is None) and self.tokenizer is not None:
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            reasoning = self.parser_cls.split(text, self.in_thinking).reasoning
            return (
                len(self.tokenizer.encode(reasoning, add_special_tokens=False)) if reasoning else 0
            )
        first = 1 if ids and ids[0] == self.start_id else 0
        if not (self.in_thinking or first):
            return 0
        try:
            return ids.index(self.end_id, first) - first
        except ValueError:  # never closed (or the marker is not one token)
            return len(ids) - first


def reasoning_effort_kwargs(req: ChatCompletionRequest) -> dict | None:
    """chat_template_kwargs with `reasoning_effort` added when the request set it."""
    kwargs = req.chat_template_kwargs
    if req.reasoning_effort is None:
        return kwargs
    return {"reasoning_effort": req.reasoning_effort, **(kwargs or {})}


def plan_reasoning(
    req: ChatCompletionRequest,
    parser_name: str | None,
    tokenizer,
    prompt_ids: list[int],
    grammar: bool,
) -> tuple[ReasoningPlan | None, ThinkingParams | None]:
    """This request's reasoning plan and the engine's thinking rules (None, None: none).
    `grammar`: the request's output is constrained (its grammar must wait for the answer)."""
    budget = req.thinking_token_budget
    if parser_name is None:
        if budget is not None:
            raise APIError(
                400,
                "thinking_token_budget needs a reasoning model served with --reasoning-parser",
                param="thinking_token_budget",
            )
        return None, None
    cls = REASONING_PARSERS[parser_name]
    tail = tokenizer.decode(prompt_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
    parser = cls.for_request(tail, req.chat_template_kwargs)
    if parser is None:  # thinking off for this request: nothing to split, budget moot
        return None, None
    start_id, end_id = _token_id(tokenizer, cls.start), _token_id(tokenizer, cls.end)
    plan = ReasoningPlan(
        cls, parser.state == "thinking", start_id, end_id, req.include_reasoning, tokenizer
    )
    if budget is None and not grammar:
        return plan, None
    if start_id is None or end_id is None:
        param = "thinking_token_budget" if budget is not None else "response_format"
        raise APIError(
            400,
            f"this model's {cls.start} / {cls.end} are not single tokens: "
            "thinking_token_budget and constrained output after the thinking "
            "need them to be",
            param=param,
        )
    return plan, ThinkingParams(start_id, end_id, thinking=plan.in_thinking, budget=budget)


def keeps_special_tokens(parser_name: str | None) -> bool:
    """The parser's markers are special tokens (gpt-oss): the text must keep them."""
    return parser_name is not None and REASONING_PARSERS[parser_name].special_tokens


def _token_id(tokenizer, marker: str) -> int | None:
    ids = tokenizer.encode(marker, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None
