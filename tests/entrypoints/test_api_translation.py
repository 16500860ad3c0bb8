"""The Anthropic Messages and OpenAI Responses translations on their own (no server): request
items -> chat messages, and hand-written chat chunks -> each API's stream events, for the
orders a real stream can take (text then calls, several calls, nothing at all)."""

from __future__ import annotations

import asyncio
import json

import pytest

from pagedllm.entrypoints.anthropic_errors import AnthropicErrorShape
from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.messages_convert import stop_reason, to_chat_request
from pagedllm.entrypoints.protocol_anthropic import MessagesRequest
from pagedllm.entrypoints.protocol_openai_responses import ResponsesRequest
from pagedllm.entrypoints.responses_convert import items_to_messages
from pagedllm.entrypoints.responses_output import output_items
from pagedllm.entrypoints.responses_stream import ResponsesStream
from pagedllm.entrypoints.serving_messages import MessagesStream


def _chunk(delta: dict, finish: str | None = None, stop=None, usage=(7, 0)) -> dict:
    return {
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "stop_reason": stop}],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }


def _call(index: int, call_id: str | None, name: str | None, args: str) -> dict:
    fn = {"arguments": args} | ({"name": name} if name else {})
    return {
        "index": index,
        **({"id": call_id, "type": "function"} if call_id else {}),
        "function": fn,
    }


def _events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in filter(None, text.split("\n\n")):
        event, data = block.split("\n")
        out.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


# ------------------------------------------------------------------ Anthropic
def test_anthropic_messages_become_chat_messages():
    req = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 5,
            "system": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}],
            "messages": [
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "s"},
                        {"type": "text", "text": "Let me look."},
                        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "thanks"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "is_error": True,
                            "content": [{"type": "text", "text": "boom"}],
                        },
                    ],
                },
            ],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
        }
    )
    chat = to_chat_request(req)
    msgs = [m.model_dump(exclude_none=True) for m in chat.messages]
    assert msgs[0] == {"role": "system", "content": "AB"}
    assert msgs[2]["content"] == "Let me look." and msgs[2]["tool_calls"][0]["function"] == {
        "name": "f",
        "arguments": '{"x": 1}',
    }
    # tool results come first (they answer the call), then the turn's text
    assert msgs[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: boom"}
    assert msgs[4] == {"role": "user", "content": "thanks"}
    assert chat.tool_choice == "required" and chat.parallel_tool_calls is False
    assert chat.max_tokens == 5


def test_anthropic_stop_reasons():
    assert stop_reason("stop", None, None) == ("end_turn", None)
    assert stop_reason("stop", "END", ["END"]) == ("stop_sequence", "END")
    assert stop_reason("stop", 2, ["END"]) == ("end_turn", None)  # a stop token, not a string
    assert stop_reason("length", None, None) == ("max_tokens", None)
    assert stop_reason("tool_calls", None, None) == ("tool_use", None)


def test_anthropic_stream_text_then_two_calls():
    conv = MessagesStream("msg_1", None)
    text = conv.chunk(_chunk({"role": "assistant", "content": ""}))
    text += conv.chunk(_chunk({"content": "Sure."}, usage=(7, 2)))
    text += conv.chunk(
        _chunk(
            {"tool_calls": [_call(0, "call_a", "f", '{"x": 1}'), _call(1, "call_b", "g", "{}")]},
            finish="tool_calls",
            usage=(7, 9),
        )
    )
    text += conv.chunk(
        {"model": "m", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9}}
    )
    text += conv.done()
    events = _events(text)
    assert [n for n, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    starts = [d for n, d in events if n == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2]
    assert starts[1]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_a",
        "name": "f",
        "input": {},
    }
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert deltas[1] == {"type": "input_json_delta", "partial_json": '{"x": 1}'}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"] == {"output_tokens": 9}


def test_anthropic_stream_named_call_arguments_in_pieces():
    conv = MessagesStream("msg_1", None)
    text = conv.chunk(_chunk({"role": "assistant", "content": ""}))
    text += conv.chunk(_chunk({"tool_calls": [_call(0, "call_a", "f", '{"x"')]}))
    text += conv.chunk(_chunk({"tool_calls": [_call(0, None, None, ": 1}")]}, finish="stop"))
    text += conv.done()
    events = _events(text)
    assert [n for n, _ in events].count("content_block_start") == 1
    pieces = [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta"]
    assert "".join(pieces) == '{"x": 1}'


# ------------------------------------------------------------------ Responses
def test_response_items_become_chat_messages():
    items = [
        {"type": "message", "role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"type": "reasoning", "summary": []},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": "2"},
    ]
    msgs = items_to_messages(items)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool"]
    assert msgs[1]["content"] == "ab"
    assert msgs[2]["content"] == "Checking."
    assert [c["id"] for c in msgs[2]["tool_calls"]] == ["c1", "c2"]
    assert msgs[4] == {"role": "tool", "tool_call_id": "c2", "content": "2"}
    with pytest.raises(APIError, match="item_reference"):
        items_to_messages([{"type": "item_reference", "id": "x"}])
    with pytest.raises(APIError, match="call_id"):
        items_to_messages([{"type": "function_call", "name": "f", "arguments": "{}"}])


def test_response_output_items():
    chat = {
        "choices": [
            {
                "finish_reason": "tool_calls",
                "message": {
                    "content": None,
                    "tool_calls": [{"id": "call_1", "function": {"name": "f", "arguments": "{}"}}],
                },
            }
        ]
    }
    (item,) = output_items(chat)
    assert item["type"] == "function_call" and item["call_id"] == "call_1"
    chat = {"choices": [{"finish_reason": "length", "message": {"content": ""}}]}
    (item,) = output_items(chat)  # nothing generated: still one (empty) message
    assert item["type"] == "message" and item["status"] == "incomplete"
    assert item["content"][0]["text"] == ""


def test_responses_stream_text_then_call():
    req = ResponsesRequest.model_validate({"model": "m", "input": "x", "store": True})
    stored = []
    conv = ResponsesStream(req, "resp_1", 0, stored.append)
    text = conv.chunk(_chunk({"role": "assistant", "content": ""}))
    text += conv.chunk(_chunk({"content": "Hi"}))
    text += conv.chunk(_chunk({"content": "!"}))
    text += conv.chunk(
        _chunk(
            {"tool_calls": [_call(0, "call_a", "f", '{"x": 1}')]}, finish="tool_calls", usage=(7, 5)
        )
    )
    text += conv.done()
    events = _events(text)
    assert [n for n, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    final = events[-1][1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["output"][0]["content"][0]["text"] == "Hi!"
    assert final["output"][1]["arguments"] == '{"x": 1}'
    assert [d["output_index"] for n, d in events if n == "response.output_item.done"] == [0, 1]
    assert final["status"] == "completed" and final["usage"]["output_tokens"] == 5
    assert stored == [final]


def test_responses_stream_error():
    req = ResponsesRequest.model_validate({"model": "m", "input": "x"})
    stored = []
    conv = ResponsesStream(req, "resp_1", 0, stored.append)
    text = conv.chunk(_chunk({"role": "assistant", "content": ""}))
    text += conv.error({"message": "engine error: x", "type": "server_error"})
    text += conv.done()
    events = _events(text)
    assert [n for n, _ in events][-2:] == ["error", "response.failed"]
    assert events[-1][1]["response"]["status"] == "failed" and not stored


# ------------------------------------------------------------------ reasoning
def test_anthropic_stream_thinking_block_first():
    conv = MessagesStream("msg_1", None)
    text = conv.chunk(_chunk({"role": "assistant", "content": ""}))
    text += conv.chunk(_chunk({"reasoning_content": "Hm, "}))
    text += conv.chunk(_chunk({"reasoning_content": "seven."}))
    text += conv.chunk(_chunk({"content": "Yes."}, finish="stop"))
    text += conv.done()
    events = _events(text)
    starts = [d["content_block"] for n, d in events if n == "content_block_start"]
    assert starts == [
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "text", "text": ""},
    ]
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert deltas == [
        {"type": "thinking_delta", "thinking": "Hm, "},
        {"type": "thinking_delta", "thinking": "seven."},
        {"type": "text_delta", "text": "Yes."},
    ]


def test_responses_reasoning_item_streamed_and_not():
    chat = {
        "choices": [
            {
                "finish_reason": "stop",
                "message": {"content": "Yes.", "reasoning_content": "Hm, seven."},
            }
        ]
    }
    items = output_items(chat)
    assert [i["type"] for i in items] == ["reasoning", "message"]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "Hm, seven."}]
    # cut inside the thinking: only the (incomplete) reasoning item
    chat = {
        "choices": [
            {"finish_reason": "length", "message": {"content": None, "reasoning_content": "Hm"}}
        ]
    }
    (item,) = output_items(chat)
    assert item["type"] == "reasoning" and item["status"] == "incomplete"

    req = ResponsesRequest.model_validate({"model": "m", "input": "x"})
    conv = ResponsesStream(req, "resp_1", 0, lambda final: None)
    text = conv.chunk(_chunk({"role": "assistant", "content": ""}))
    text += conv.chunk(_chunk({"reasoning_content": "Hm, "}))
    text += conv.chunk(_chunk({"reasoning_content": "seven."}))
    text += conv.chunk(_chunk({"content": "Yes."}, finish="stop"))
    text += conv.done()
    events = _events(text)
    assert [n for n, _ in events][2:9] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    final = events[-1][1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][0]["content"][0]["text"] == "Hm, seven."
    assert final["output"][1]["content"][0]["text"] == "Yes."


# ------------------------------------------------------------------ Anthropic errors
def _asgi_call(app, path: str) -> tuple[int, bytes]:
    """One GET through `app` (an ASGI callable): (status, body)."""
    out: dict = {"body": b""}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        else:
            out["body"] += message.get("body", b"")

    scope = {"type": "http", "path": path, "method": "GET", "headers": []}
    asyncio.run(app(scope, receive, send))
    return out["status"], out["body"]


def test_anthropic_error_shape_middleware():
    async def openai_404(scope, receive, send):
        body = json.dumps({"error": {"message": "no such model", "type": "x"}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 404,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"3")],
            }
        )
        await send({"type": "http.response.body", "body": body[:10], "more_body": True})
        await send({"type": "http.response.body", "body": body[10:]})

    async def boom(scope, receive, send):
        raise RuntimeError("kaput")

    status, body = _asgi_call(AnthropicErrorShape(openai_404), "/v1/messages")
    assert status == 404 and json.loads(body) == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "no such model"},
    }
    # other paths keep the OpenAI shape
    status, body = _asgi_call(AnthropicErrorShape(openai_404), "/v1/chat/completions")
    assert json.loads(body)["error"]["message"] == "no such model"
    status, body = _asgi_call(AnthropicErrorShape(boom), "/v1/messages/count_tokens")
    assert status == 500 and json.loads(body)["error"] == {
        "type": "api_error",
        "message": "internal error: kaput",
    }
    with pytest.raises(RuntimeError):
        _asgi_call(AnthropicErrorShape(boom), "/v1/completions")
