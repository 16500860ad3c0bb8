"""Anthropic Messages <-> the chat route: a /v1/messages request as a chat-completions request
(so it runs on the chat route's path: template, sampling, structured output, tool calling),
and a chat completion back as an Anthropic message.

    system (string or text blocks)       -> a system message
    user text blocks                     -> a user message
    user tool_result blocks              -> one "tool" message each (tool_call_id = tool_use_id;
                                            an is_error result's text starts with "Error: ")
    assistant text + tool_use blocks     -> an assistant message with tool_calls
    tools [{name, description, input_schema}] -> function tools (parameters = input_schema)
    tool_choice auto / any / tool / none -> "auto" / "required" / named / "none";
                                            disable_parallel_tool_use -> parallel_tool_calls
    max_tokens, stop_sequences, temperature, top_p, top_k -> the same sampling fields
    output_config.format (json_schema)   -> response_format json_schema (structured output)
    output_config.effort                 -> reasoning_effort (a chat template variable)
    thinking enabled / disabled          -> thinking_token_budget / enable_thinking=false

    reasoning_content (--reasoning-parser) -> a thinking block before the text

    finish "stop" + a stop string matched -> stop_reason "stop_sequence" (+ stop_sequence)
    finish "stop"                        -> "end_turn"
    finish "length"                      -> "max_tokens"
    finish "tool_calls"                  -> "tool_use"
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pagedllm.entrypoints.chat_translate import chat_request
from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.protocol import ChatCompletionRequest
from pagedllm.entrypoints.protocol_anthropic import (
    ContentBlock,
    Message,
    MessagesFields,
    MessagesRequest,
    OutputTextBlock,
    ThinkingBlock,
    ThinkingConfig,
    ToolUseBlock,
    Usage,
)
from pagedllm.entrypoints.request_fields import check_request_fields

_DROPPED_IN_ASSISTANT = ("thinking", "redacted_thinking")
# chat request field -> the Anthropic field it came from (400s name the latter)
_FIELDS = {
    "max_tokens": "max_tokens",
    "stop": "stop_sequences",
    "reasoning_effort": "output_config",
    "thinking_token_budget": "thinking",
    "chat_template_kwargs": "thinking",
    "include_reasoning": "thinking",
    "response_format": "output_config",
}


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def tool_use_id(chat_id: str | None) -> str:
    """Anthropic-style id for a chat tool call id (call_<hex> -> toolu_<hex>)."""
    tail = (chat_id or "").removeprefix("call_") or uuid.uuid4().hex[:24]
    return f"toolu_{tail}"


def to_chat_request(req: MessagesFields, *, count_only: bool = False) -> ChatCompletionRequest:
    """The chat-completions request that serves `req` (a MessagesRequest, or a
    CountTokensRequest with `count_only`). 400s name the Anthropic field."""
    check_request_fields(req)
    body: dict[str, Any] = {"model": req.model, "messages": _messages(req)}
    if req.tools:
        body["tools"] = [_tool(i, t) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        body.update(_tool_choice(req))
    if req.thinking is not None:
        body.update(_thinking(req.thinking))
    if req.output_config is not None:
        if req.output_config.effort is not None:
            body["reasoning_effort"] = req.output_config.effort
        if req.output_config.format is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": req.output_config.format.json_schema},
            }
    if not count_only:
        assert isinstance(req, MessagesRequest)
        body.update(
            max_tokens=req.max_tokens,
            stop=req.stop_sequences,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            stream=req.stream,
        )
        if req.stream:  # usage in every chunk: message_start carries the input tokens
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return chat_request(body, _FIELDS)


def _thinking(thinking: ThinkingConfig) -> dict:
    """The chat fields of Anthropic's thinking config (see ThinkingConfig)."""
    out: dict[str, Any] = {}
    if thinking.type == "enabled":
        if thinking.budget_tokens is None:
            raise APIError(400, 'thinking of type "enabled" needs budget_tokens', param="thinking")
        out["thinking_token_budget"] = thinking.budget_tokens
    elif thinking.type == "disabled":
        out["chat_template_kwargs"] = {"enable_thinking": False}
    if thinking.display == "omitted":
        out["include_reasoning"] = False
    return out


def _tool(index: int, tool) -> dict:
    if tool.type not in (None, "custom"):
        raise APIError(
            400,
            f"tools.{index}: tools of type {tool.type!r} are not supported "
            "(client tools with an input_schema only)",
            param="tools",
        )
    fn = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        fn["description"] = tool.description
    return {"type": "function", "function": fn}


def _tool_choice(req: MessagesFields) -> dict:
    choice = req.tool_choice
    out: dict[str, Any] = {"parallel_tool_calls": not choice.disable_parallel_tool_use}
    if choice.type == "tool":
        if not choice.name:
            raise APIError(400, 'tool_choice of type "tool" needs a name', param="tool_choice")
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    return out


def _messages(req: MessagesFields) -> list[dict]:
    out: list[dict] = []
    if req.system is not None:
        text = req.system if isinstance(req.system, str) else "".join(b.text for b in req.system)
        out.append({"role": "system", "content": text})
    for i, m in enumerate(req.messages):
        where = f"messages.{i}"
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
        elif m.role == "assistant":
            out.append(_assistant(m.content, where))
        else:
            out.extend(_user(m.content, where))
    return out


def _assistant(blocks: list[ContentBlock], where: str) -> dict:
    text, calls = [], []
    for j, b in enumerate(blocks):
        if b.type == "text":
            text.append(_text(b, f"{where}.content.{j}"))
        elif b.type == "tool_use":
            if not b.id or not b.name or b.input is None:
                raise APIError(
                    400,
                    f"{where}.content.{j}: a tool_use block needs id, name and input",
                    param="messages",
                )
            calls.append(
                {
                    "id": b.id,
                    "type": "function",
                    "function": {
                        "name": b.name,
                        "arguments": json.dumps(b.input, ensure_ascii=False),
                    },
                }
            )
        elif b.type not in _DROPPED_IN_ASSISTANT:
            _unsupported(b, f"{where}.content.{j}")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _user(blocks: list[ContentBlock], where: str) -> list[dict]:
    """Tool results first (each a "tool" message, in order), then the turn's text."""
    results, text = [], []
    for j, b in enumerate(blocks):
        at = f"{where}.content.{j}"
        if b.type == "text":
            text.append(_text(b, at))
        elif b.type == "tool_result":
            if not b.tool_use_id:
                raise APIError(
                    400, f"{at}: a tool_result block needs tool_use_id", param="messages"
                )
            content = _result_text(b.content, at)
            if b.is_error:
                content = f"Error: {content}"
            results.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": content})
        else:
            _unsupported(b, at)
    return [*results, *([{"role": "user", "content": "".join(text)}] if text else [])]


def _result_text(content: str | list[ContentBlock] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for k, b in enumerate(content):
        if b.type != "text":
            _unsupported(b, f"{where}.content.{k}")
    return "".join(_text(b, where) for b in content)


def _text(b: ContentBlock, where: str) -> str:
    if b.text is None:
        raise APIError(400, f"{where}: a text block needs text", param="messages")
    return b.text


def _unsupported(b: ContentBlock, where: str) -> None:
    raise APIError(
        400,
        f"{where}: content blocks of type {b.type!r} are not supported "
        "(text, tool_use and tool_result only)",
        param="messages",
    )


# ------------------------------------------------------------------ results
def stop_reason(
    finish: str | None, matched: Any, stop_sequences: list[str] | None
) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) for a chat choice's finish_reason / stop_reason."""
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return ("end_turn", None) if finish is not None else (None, None)


def tool_input(arguments: str) -> dict:
    """A call's arguments as the object Anthropic sends (text that is not a JSON object, from
    an unconstrained parser, is kept under "arguments" rather than dropped)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def to_message(chat: dict, req: MessagesRequest, msg_id: str) -> Message:
    """A chat.completion body (one choice) as an Anthropic message."""
    choice = chat["choices"][0]
    message = choice["message"]
    blocks: list[ThinkingBlock | OutputTextBlock | ToolUseBlock] = []
    if message.get("reasoning_content"):
        blocks.append(ThinkingBlock(thinking=message["reasoning_content"]))
    if message.get("content"):
        blocks.append(OutputTextBlock(text=message["content"]))
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        blocks.append(
            ToolUseBlock(
                id=tool_use_id(call.get("id")), name=fn["name"], input=tool_input(fn["arguments"])
            )
        )
    if not blocks:
        blocks.append(OutputTextBlock(text=""))
    reason, sequence = stop_reason(
        choice["finish_reason"], choice.get("stop_reason"), req.stop_sequences
    )
    usage = chat["usage"]
    return Message(
        id=msg_id,
        model=chat["model"],
        content=blocks,
        stop_reason=reason,
        stop_sequence=sequence,
        usage=Usage(input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"]),
    )
