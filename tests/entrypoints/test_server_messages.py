"""POST /v1/messages and /v1/messages/count_tokens (the Anthropic Messages API) through the
real `anthropic` SDK against a `pagedllm serve` process on the tiny random model: create,
stream (text_stream and the raw events), a tool round trip, count_tokens, errors in
Anthropic's shape, x-api-key."""

from __future__ import annotations

import json
from typing import Literal

import anthropic
import httpx
import jsonschema
import pytest
from pydantic import BaseModel
from server_harness import TINY_SERVER_ARGS, start_server, wait_idle

API_KEY = "sk-test-messages"
FAULT = "FAULTOUT"  # a prompt with it fails inside the engine (tests/fault_injection.py)
WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 10},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
CLOCK = {
    "name": "get_time",
    "input_schema": {
        "type": "object",
        "properties": {"zone": {"type": "string", "pattern": "^UTC[+-][0-9]$"}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}
USER = [{"role": "user", "content": "What's the weather in Paris?"}]
# Sampling fields are no longer in the SDK's signature: sent as extra_body, as clients do.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(
        tmp_path_factory,
        tiny_model_path,
        [
            *TINY_SERVER_ARGS,
            "--served-model-name",
            "tiny",
            "--api-key",
            API_KEY,
            "--enable-auto-tool-choice",
            "--tool-call-parser",
            "hermes",
        ],
        env={"PAGEDLLM_TEST_FAULTS": f"output={FAULT}"},
        name="messages",
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    # The SDK sends the key as x-api-key (not Authorization: Bearer).
    return anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0)


def _post(server, path: str, body: dict, **headers) -> httpx.Response:
    return httpx.post(
        f"{server.base_url}{path}", json=body, timeout=60, headers={"x-api-key": API_KEY, **headers}
    )


def _chat_text(server, **body) -> dict:
    r = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json=body,
        timeout=60,
        headers={"Authorization": f"Bearer {API_KEY}"},
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_create_matches_the_chat_route(server, client):
    msg = client.messages.create(
        model="tiny", max_tokens=12, messages=USER, system="You are terse.", extra_body=GREEDY
    )
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert msg.model == "tiny"
    (block,) = msg.content
    assert block.type == "text"
    # The same conversation through the chat route: same greedy text, same token counts.
    chat = _chat_text(
        server,
        model="tiny",
        max_tokens=12,
        **GREEDY,
        messages=[{"role": "system", "content": "You are terse."}, *USER],
    )
    assert block.text == chat["choices"][0]["message"]["content"]
    assert msg.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert msg.usage.output_tokens == chat["usage"]["completion_tokens"]
    want = {"length": "max_tokens", "stop": "end_turn"}[chat["choices"][0]["finish_reason"]]
    assert msg.stop_reason == want


def test_system_blocks_top_k_top_p_metadata(client):
    msg = client.messages.create(
        model="tiny",
        max_tokens=4,
        messages=USER,
        extra_body={"top_k": 5, "top_p": 0.9},
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        metadata={"user_id": "u-1"},
    )
    assert msg.usage.output_tokens <= 4 and msg.content[0].type == "text"


def test_max_tokens_and_stop_sequence(client):
    msg = client.messages.create(model="tiny", max_tokens=5, messages=USER, extra_body=GREEDY)
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 5
    text = (
        client.messages.create(model="tiny", max_tokens=20, messages=USER, extra_body=GREEDY)
        .content[0]
        .text
    )
    stop = text[3:6]  # a piece the greedy answer is known to contain
    msg = client.messages.create(
        model="tiny", max_tokens=20, messages=USER, extra_body=GREEDY, stop_sequences=[stop]
    )
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop
    assert msg.content[0].text == text[: text.index(stop)]


def test_stream_text_and_events(server, client):
    full = client.messages.create(model="tiny", max_tokens=10, messages=USER, extra_body=GREEDY)
    with client.messages.stream(
        model="tiny", max_tokens=10, messages=USER, extra_body=GREEDY
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == full.content[0].text == final.content[0].text
    assert final.stop_reason == full.stop_reason and final.usage == full.usage
    # The raw stream: each event named on its `event:` line (the SDK drops `ping`).
    r = _post(
        server,
        "/v1/messages",
        {"model": "tiny", "max_tokens": 10, "messages": USER, "stream": True, **GREEDY},
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _named_events(r.text)
    kinds = [name for name, _ in events]
    assert kinds[:3] == ["message_start", "ping", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[3:-3]) == {"content_block_delta"}
    assert all(data["type"] == name for name, data in events)
    assert events[0][1]["message"]["usage"]["input_tokens"] == full.usage.input_tokens
    assert events[-2][1]["usage"]["output_tokens"] == 10
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == text


def _named_events(raw: str) -> list[tuple[str, dict]]:
    out = []
    for block in raw.split("\n\n"):
        if block.strip():
            event, data = block.split("\n")
            out.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def _input_valid(block, schema) -> None:
    assert block.type == "tool_use" and block.id.startswith("toolu_")
    jsonschema.validate(block.input, schema)


def test_tool_round_trip(client):
    tools = [WEATHER, CLOCK]
    msg = client.messages.create(
        model="tiny",
        max_tokens=100,
        messages=USER,
        tools=tools,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body={"temperature": 1.0},
    )
    assert msg.stop_reason == "tool_use"
    (call,) = [b for b in msg.content if b.type == "tool_use"]
    assert call.name == "get_weather"
    _input_valid(call, WEATHER["input_schema"])
    # The tool's answer goes back as a tool_result; the model answers in text.
    history = [
        *USER,
        {"role": "assistant", "content": msg.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "21 C, sunny"},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    out = client.messages.create(
        model="tiny", max_tokens=5, messages=history, tools=tools, tool_choice={"type": "none"}
    )
    assert out.stop_reason in ("max_tokens", "end_turn") and out.content[0].type == "text"
    # The result reached the prompt: it costs tokens.
    without = client.messages.count_tokens(model="tiny", messages=history[:2], tools=tools)
    with_result = client.messages.count_tokens(model="tiny", messages=history, tools=tools)
    assert with_result.input_tokens > without.input_tokens


def test_tool_choice_any_is_valid_and_streams(client):
    kw = dict(
        model="tiny",
        max_tokens=120,
        messages=USER,
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"temperature": 1.0},
    )
    msg = client.messages.create(**kw)
    calls = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and len(calls) == 1
    _input_valid(
        calls[0], {"get_weather": WEATHER, "get_time": CLOCK}[calls[0].name]["input_schema"]
    )
    # Named tool, streamed: input_json_delta pieces assemble to a valid input.
    with client.messages.stream(
        **{**kw, "tool_choice": {"type": "tool", "name": "get_time"}}
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (call,) = final.content
    _input_valid(call, CLOCK["input_schema"])
    assert any(e.type == "input_json" for e in events)


def test_tool_choice_auto_runs_the_tool_parser(server, client):
    # Unscripted, the tiny model writes no <tool_call>: the hermes parser passes it through as
    # text, the same text the chat route returns for the same auto request.
    tools = [WEATHER]
    msg = client.messages.create(
        model="tiny", max_tokens=8, messages=USER, tools=tools, extra_body=GREEDY
    )
    chat = _chat_text(
        server,
        model="tiny",
        max_tokens=8,
        **GREEDY,
        messages=USER,
        tool_choice="auto",
        tools=[
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": WEATHER["description"],
                    "parameters": WEATHER["input_schema"],
                },
            }
        ],
    )
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == chat["choices"][0]["message"]["content"]


class City(BaseModel):
    # Enums: the SDK keeps them in the schema it sends, where it moves string lengths and
    # number bounds into descriptions (and checks them only on the client), which no grammar
    # can hold a random model to.
    name: Literal["Paris", "Lyon", "Nice", "Lille"]
    population: Literal[100000, 500000, 2000000]


def test_parse_with_output_format(client):
    # The SDK sends the pydantic model as output_config.format: the chat route's structured
    # output holds the tiny model to it.
    msg = client.messages.parse(
        model="tiny",
        max_tokens=100,
        messages=USER,
        output_format=City,
        extra_body={"temperature": 1.0},
    )
    assert isinstance(msg.parsed_output, City)
    assert msg.stop_reason == "end_turn"


def test_count_tokens_matches_create(client):
    tools = [WEATHER]
    counted = client.messages.count_tokens(model="tiny", messages=USER, system="Hi.", tools=tools)
    msg = client.messages.create(
        model="tiny",
        max_tokens=1,
        messages=USER,
        system="Hi.",
        tools=tools,
        tool_choice={"type": "none"},
    )
    assert counted.input_tokens == msg.usage.input_tokens > 0


def _anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    return body["error"]["message"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"messages": USER}, "max_tokens"),  # required
        ({"max_tokens": 5, "messages": []}, "messages"),
        (
            {
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}],
                    }
                ],
            },
            "image",
        ),
        (
            {
                "max_tokens": 5,
                "messages": USER,
                "thinking": {"type": "enabled", "budget_tokens": 1024},
            },
            "thinking",
        ),
        (
            {
                "max_tokens": 5,
                "messages": USER,
                "tools": [
                    {"type": "web_search_20250305", "name": "web_search", "input_schema": {}}
                ],
            },
            "web_search",
        ),
        (
            {
                "max_tokens": 5,
                "messages": USER,
                "tools": [WEATHER],
                "tool_choice": {"type": "tool", "name": "nope"},
            },
            "nope",
        ),
        ({"max_tokens": 5, "messages": USER, "temperature": 1.5}, "temperature"),
        ({"max_tokens": 5000, "messages": USER}, "max_model_len"),
    ],
)
def test_bad_requests_are_400_in_anthropic_shape(server, body, words):
    message = _anthropic_error(
        _post(server, "/v1/messages", {"model": "tiny", **body}), 400, "invalid_request_error"
    )
    assert words in message


def test_errors_through_the_sdk(server, client):
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="claude-nope", max_tokens=5, messages=USER)
    assert err.value.body["error"]["type"] == "not_found_error"
    bad_key = anthropic.Anthropic(base_url=server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad_key.messages.create(model="tiny", max_tokens=5, messages=USER)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.count_tokens(model="tiny", messages=[])
    assert err.value.body["type"] == "error"
    r = httpx.post(
        f"{server.base_url}/v1/messages",
        content=b"{}",
        timeout=10,
        headers={"x-api-key": API_KEY, "content-type": "text/plain"},
    )
    _anthropic_error(r, 415, "invalid_request_error")
    r = httpx.post(f"{server.base_url}/v1/messages", json={}, timeout=10)
    _anthropic_error(r, 401, "authentication_error")
    # The OpenAI routes keep OpenAI's shape.
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json={}, timeout=10)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_engine_failure_is_an_anthropic_error(server, client):
    msgs = [{"role": "user", "content": f"{FAULT} please"}]
    r = _post(server, "/v1/messages", {"model": "tiny", "max_tokens": 5, "messages": msgs})
    _anthropic_error(r, 500, "api_error")
    # Streamed: the message starts, then an `error` event ends the stream (no message_stop).
    r = _post(
        server, "/v1/messages", {"model": "tiny", "max_tokens": 5, "messages": msgs, "stream": True}
    )
    events = _named_events(r.text)
    assert [name for name, _ in events] == ["message_start", "ping", "error"]
    assert events[-1][1]["type"] == "error" and events[-1][1]["error"]["type"] == "api_error"
    with (
        pytest.raises(anthropic.APIStatusError),
        client.messages.stream(model="tiny", max_tokens=5, messages=msgs) as stream,
    ):
        stream.get_final_message()


def test_no_blocks_leak(server):
    m = wait_idle(server.base_url)
    assert m["pagedllm:kv_cache_usage_perc"] == 0
