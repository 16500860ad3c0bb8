"""One chat choice's text -> the assistant message: reasoning (--reasoning-parser), then
content and tool calls (tool_calls.py) from the text after the thinking; whole, or delta by
delta for streams.

    text delta --ReasoningParser--> reasoning | answer --ToolCallStreamer--> content | calls
"""

from __future__ import annotations

from pagedllm.entrypoints.chat_reasoning import ReasoningPlan
from pagedllm.entrypoints.protocol_responses import (
    AssistantMessage,
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
)
from pagedllm.entrypoints.tool_call_deltas import ToolCallDeltas
from pagedllm.entrypoints.tool_calls import ToolPlan, to_tool_calls, tool_call_id


class ChoiceText:
    def __init__(self, plan: ToolPlan, reasoning: ReasoningPlan | None) -> None:
        self.plan = plan
        self.reasoning = reasoning
        self.reasoner = reasoning.parser() if reasoning is not None else None
        self.tools = plan.streamer()
        self.deltas = ToolCallDeltas(plan.max_calls)

    @property
    def num_calls(self) -> int:
        return self.tools.num_calls

    # ------------------------------------------------------------ whole
    def message(self, text: str) -> AssistantMessage:
        """The non-streamed message of the whole `text`."""
        reasoning = None
        if self.reasoning is not None:
            split = self.reasoning.parser_cls.split(text, self.reasoning.in_thinking)
            reasoning, text = split.reasoning or None, split.content
        # after thinking, no answer text is no content (None), as vLLM
        message = AssistantMessage(content=text if self.reasoning is None else text or None)
        if self.plan.parses:
            parsed = self.plan.parse(text)
            if parsed.calls:
                message = AssistantMessage(
                    content=parsed.content.strip() or None, tool_calls=to_tool_calls(parsed.calls)
                )
        if reasoning is not None and self.reasoning.include:
            message.reasoning_content = message.reasoning = reasoning
        return message

    # ----------------------------------------------------------- streamed
    def delta(self, text: str, last: bool) -> DeltaMessage:
        """This step's delta: reasoning as it comes; content as it comes; tool-call arguments as
        they come (a named call's; under `auto`, those of parsers that report the open call),
        other tool calls whole, once each closes (tool_call_deltas.py)."""
        reasoning = ""
        if self.reasoner is not None:
            out = self.reasoner.feed(text)
            if last:
                out.extend(self.reasoner.finish())
            reasoning, text = out.reasoning, out.content
        message = self._answer_delta(text, last)
        if self.reasoning is not None and message.content == "":
            message.content = None  # thinking steps carry reasoning only
        if reasoning and self.reasoning.include:
            message.reasoning_content = message.reasoning = reasoning
        return message

    def _answer_delta(self, text: str, last: bool) -> DeltaMessage:
        plan, tools = self.plan, self.tools
        if plan.mode == "named":
            # One entry per call index per chunk, as OpenAI sends: the first opens the call
            # (id, name) with the arguments so far; later ones carry only arguments. Two
            # entries of one index in a chunk broke openai 3.3's stream and instructor.
            if tools.num_calls == 0 and (text or last):
                tools.num_calls = 1
                call = DeltaToolCall(
                    index=0,
                    id=tool_call_id(),
                    type="function",
                    function=DeltaFunctionCall(name=plan.name, arguments=text),
                )
            elif text and tools.num_calls:
                call = DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=text))
            else:
                return DeltaMessage()
            return DeltaMessage(tool_calls=[call])
        before = tools.num_calls
        out = tools.feed(text)
        if last:
            out.extend(tools.finish())
        if not plan.parses:
            return DeltaMessage(content=out.content)
        calls = self.deltas.entries(before, out.calls, None if last else tools.partial())
        return DeltaMessage(content=out.content or None, tool_calls=calls or None)
