"""Chat results as Responses API objects: output items, usage and the `response` object
(non-streamed results; responses_stream.py builds the same items event by event).

    chat reasoning_content (--reasoning-parser) -> a "reasoning" item (reasoning_text content)
    chat content                          -> a "message" item with one output_text part
    chat tool_calls                       -> "function_call" items (call_id = the chat call id)
    finish "length"                       -> status "incomplete", reason max_output_tokens
"""

from __future__ import annotations

import uuid

from pagedllm.entrypoints.protocol_openai_responses import ResponsesRequest


def item_id(prefix: str) -> str:
    """OpenAI-style ids: resp_..., msg_..., fc_..., rs_..."""
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(text: str, status: str, msg_id: str | None = None) -> dict:
    return {
        "id": msg_id or item_id("msg"),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [output_text(text)],
    }


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(
    call_id: str, name: str, arguments: str, status: str = "completed", fc_id: str | None = None
) -> dict:
    return {
        "id": fc_id or item_id("fc"),
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def reasoning_item(text: str, status: str, rs_id: str | None = None) -> dict:
    return {
        "id": rs_id or item_id("rs"),
        "type": "reasoning",
        "status": status,
        "summary": [],
        "content": [reasoning_text(text)],
    }


def reasoning_text(text: str) -> dict:
    return {"type": "reasoning_text", "text": text}


def output_items(chat: dict) -> list[dict]:
    """A chat.completion body's first choice as Responses output items."""
    choice = chat["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    reasoning = message.get("reasoning_content")
    status = "incomplete" if choice["finish_reason"] == "length" else "completed"
    items = []
    if reasoning:
        thinking_cut = status == "incomplete" and not (message.get("content") or calls)
        items.append(reasoning_item(reasoning, "incomplete" if thinking_cut else "completed"))
    if message.get("content") or not (calls or reasoning):
        items.append(message_item(message.get("content") or "", status))
    for call in calls:
        fn = call["function"]
        items.append(function_call_item(call["id"], fn["name"], fn["arguments"]))
    return items


def chat_usage(chat_usage_info: dict) -> dict:
    """Chat usage as the Responses API's (reasoning tokens: --reasoning-parser)."""
    prompt, completion = chat_usage_info["prompt_tokens"], chat_usage_info["completion_tokens"]
    cached = (chat_usage_info.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    details = chat_usage_info.get("completion_tokens_details") or {}
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": details.get("reasoning_tokens", 0)},
        "total_tokens": prompt + completion,
    }


def response_object(
    req: ResponsesRequest,
    resp_id: str,
    created_at: int,
    model: str,
    status: str,
    output: list[dict],
    usage_info: dict | None,
) -> dict:
    """The `response` object (the body of a call, of GET, and of the stream's
    response.created / response.completed events)."""
    fmt = req.text.format if req.text is not None and req.text.format is not None else None
    text = {"format": fmt.model_dump(exclude_none=True, by_alias=True) if fmt else {"type": "text"}}
    choice = req.tool_choice
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": ({"reason": "max_output_tokens"} if status == "incomplete" else None),
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": req.reasoning.model_dump() if req.reasoning is not None else None,
        "store": req.store,
        "temperature": req.temperature,
        "text": text,
        "tool_choice": (
            choice
            if isinstance(choice, str)
            else choice.model_dump()
            if choice is not None
            else "auto"
        ),
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "top_p": req.top_p,
        "truncation": "disabled",
        "usage": usage_info,
        "metadata": req.metadata or {},
        "user": req.user,
    }
