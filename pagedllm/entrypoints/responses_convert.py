"""OpenAI Responses -> the chat route: a /v1/responses request as a chat-completions request
(so it runs on the chat route's path: template, sampling, structured output, tool calling,
reasoning).

    instructions                          -> a system message (first; not carried over by
                                             previous_response_id, as OpenAI)
    message items (developer -> system)   -> messages; input_text / output_text parts joined
    function_call items                   -> an assistant message's tool_calls (consecutive
                                             calls, and a directly preceding assistant text,
                                             make one message)
    function_call_output items            -> "tool" messages (tool_call_id = call_id)
    reasoning items                       -> dropped
    tools [{type: function, name, ...}]   -> function tools; tool_choice the same names
    text.format json_schema / json_object -> response_format (structured output)
    max_output_tokens, temperature, top_p -> max_tokens, temperature, top_p
    reasoning.effort                      -> reasoning_effort (a chat template variable)
    thinking_token_budget (vLLM's extra)  -> the same (caps the thinking)

Chat results back as Responses objects: responses_output.py.
"""

from __future__ import annotations

from typing import Any

from pagedllm.entrypoints.chat_translate import chat_request
from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.protocol import ChatCompletionRequest
from pagedllm.entrypoints.protocol_openai_responses import ResponsesRequest
from pagedllm.entrypoints.request_fields import check_request_fields

_TEXT_PARTS = ("input_text", "output_text", "text")
# chat request field -> the Responses field it came from (400s name the latter)
_FIELDS = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "reasoning_effort": "reasoning",
    "response_format": "text",
}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def input_items(req: ResponsesRequest) -> list[dict]:
    """The request's `input` as item dicts (a string is one user message)."""
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}]
    return [item.model_dump(exclude_none=True) for item in req.input]


def to_chat_request(req: ResponsesRequest, items: list[dict]) -> ChatCompletionRequest:
    """The chat request serving `req` over the whole conversation `items` (the previous
    response's conversation, if any, then this request's input)."""
    check_request_fields(req)
    messages = items_to_messages(items)
    if req.instructions is not None:
        messages.insert(0, {"role": "system", "content": req.instructions})
    if not messages:
        raise APIError(400, "input must not be empty", param="input")
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "stream": req.stream,
        "parallel_tool_calls": req.parallel_tool_calls,
    }
    if req.stream:  # usage in every chunk: the final response carries it
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if req.tools:
        body["tools"] = [_tool(i, t) for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        choice = req.tool_choice
        body["tool_choice"] = (
            choice
            if isinstance(choice, str)
            else {"type": "function", "function": {"name": choice.name}}
        )
    if req.reasoning is not None:
        if req.reasoning.summary is not None or req.reasoning.generate_summary is not None:
            raise APIError(
                400,
                "reasoning summaries are not supported (the reasoning text is "
                "the reasoning item's content)",
                param="reasoning",
            )
        body["reasoning_effort"] = req.reasoning.effort
    if req.thinking_token_budget is not None:
        body["thinking_token_budget"] = req.thinking_token_budget
    fmt = req.text.format if req.text is not None else None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise APIError(400, "text.format json_schema needs a schema", param="text")
        spec = {"name": fmt.name or "output", "schema": fmt.json_schema, "strict": fmt.strict}
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    return chat_request(body, _FIELDS)


def _tool(index: int, tool) -> dict:
    if tool.type != "function":
        raise APIError(
            400,
            f"tools.{index}: tools of type {tool.type!r} are not supported (function tools only)",
            param="tools",
        )
    if not tool.name:
        raise APIError(400, f"tools.{index}: a function tool needs a name", param="tools")
    fn = {
        k: v
        for k, v in (
            ("name", tool.name),
            ("description", tool.description),
            ("parameters", tool.parameters),
            ("strict", tool.strict),
        )
        if v is not None
    }
    return {"type": "function", "function": fn}


def items_to_messages(items: list[dict]) -> list[dict]:
    """Responses items -> chat messages (see the module docstring)."""
    out: list[dict] = []
    for i, item in enumerate(items):
        kind = item.get("type") or "message"
        where = f"input.{i}"
        if kind == "message":
            role = _ROLES.get(item.get("role") or "")
            if role is None:
                raise APIError(
                    400,
                    f"{where}: role must be one of {', '.join(_ROLES)}, got {item.get('role')!r}",
                    param="input",
                )
            out.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            if not (item.get("call_id") and item.get("name") and "arguments" in item):
                raise APIError(
                    400,
                    f"{where}: a function_call needs call_id, name and arguments",
                    param="input",
                )
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            if not item.get("call_id") or "output" not in item:
                raise APIError(
                    400, f"{where}: a function_call_output needs call_id and output", param="input"
                )
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": item["call_id"],
                    "content": _text(item["output"], where),
                }
            )
        elif kind != "reasoning":
            raise APIError(
                400,
                f"{where}: input items of type {kind!r} are not supported "
                "(message, function_call, function_call_output)",
                param="input",
            )
    return out


def _text(content: str | list[dict] | None, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for j, part in enumerate(content):
        if part.get("type") not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise APIError(
                400,
                f"{where}.content.{j}: content parts of type "
                f"{part.get('type')!r} are not supported (text only)",
                param="input",
            )
        parts.append(part["text"])
    return "".join(parts)
