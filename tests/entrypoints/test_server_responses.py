"""POST /v1/responses, GET / DELETE /v1/responses/{id} (the OpenAI Responses API) through the
real `openai` SDK against a `pagedllm serve` process on the tiny random model: create, stream,
parse (pydantic text_format), function tools, previous_response_id and the bounded store,
errors in OpenAI's shape."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from server_harness import TINY_SERVER_ARGS, start_server, wait_idle

from pagedllm.entrypoints.response_store import ResponseStore, StoredResponse

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 10},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
GREEDY = {"temperature": 0}
STORE_SIZE = 3
FAULT = "FAULTOUT"  # a prompt with it fails inside the engine (tests/fault_injection.py)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(
        tmp_path_factory,
        tiny_model_path,
        [
            *TINY_SERVER_ARGS,
            "--served-model-name",
            "tiny",
            "--max-stored-responses",
            str(STORE_SIZE),
        ],
        env={"PAGEDLLM_TEST_FAULTS": f"output={FAULT}"},
        name="responses",
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _chat(server, **body) -> dict:
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_create_matches_the_chat_route(server, client):
    resp = client.responses.create(
        model="tiny", input="Hello there", instructions="Be brief.", max_output_tokens=12, **GREEDY
    )
    assert resp.id.startswith("resp_") and resp.object == "response" and resp.model == "tiny"
    chat = _chat(
        server,
        model="tiny",
        max_tokens=12,
        **GREEDY,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello there"},
        ],
    )
    assert resp.output_text == chat["choices"][0]["message"]["content"]
    assert resp.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert resp.usage.output_tokens == chat["usage"]["completion_tokens"] == 12
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.instructions == "Be brief." and resp.max_output_tokens == 12
    (item,) = resp.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")


def test_message_list_input_roles_and_parts(client):
    resp = client.responses.create(
        model="tiny",
        max_output_tokens=4,
        top_p=0.9,
        input=[
            {"role": "developer", "content": "Answer in French."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "Good "},
                    {"type": "input_text", "text": "morning"},
                ],
            },
            {"role": "assistant", "content": [{"type": "output_text", "text": "Bonjour"}]},
            {"role": "user", "content": "Again"},
        ],
    )
    assert resp.usage.output_tokens <= 4 and resp.output[0].type == "message"


def test_stream_events_and_final_response(client):
    full = client.responses.create(model="tiny", input="Hi", max_output_tokens=10, **GREEDY)
    with client.responses.stream(
        model="tiny", input="Hi", max_output_tokens=10, **GREEDY
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == full.output_text
    assert final.usage.output_tokens == full.usage.output_tokens == 10
    assert final.usage.input_tokens == full.usage.input_tokens
    # The streamed response is stored like any other.
    assert client.responses.retrieve(final.id).output_text == final.output_text


class Person(BaseModel):
    name: str = Field(min_length=1, max_length=12)
    age: int = Field(ge=0, le=120)
    role: Literal["admin", "user"]


def test_parse_with_pydantic_text_format(client):
    resp = client.responses.parse(
        model="tiny",
        input="Describe a person.",
        text_format=Person,
        max_output_tokens=120,
        temperature=1.0,
    )
    assert isinstance(resp.output_parsed, Person)
    assert resp.text.format.type == "json_schema"
    with client.responses.stream(
        model="tiny",
        input="Describe a person.",
        text_format=Person,
        max_output_tokens=120,
        temperature=1.0,
    ) as stream:
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, Person)


def test_function_tool_round_trip(client):
    kw = dict(model="tiny", tools=[WEATHER], max_output_tokens=120, temperature=1.0)
    resp = client.responses.create(
        input="Weather in Paris?", **kw, tool_choice={"type": "function", "name": "get_weather"}
    )
    (call,) = resp.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    assert call.id.startswith("fc_") and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    # The call and its output go back as input items; the model answers in text.
    answer = client.responses.create(
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            *resp.output,
            {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"},
        ],
        **{**kw, "max_output_tokens": 5},
        tool_choice="none",
    )
    assert answer.output[0].type == "message"
    # required, streamed: the arguments deltas assemble to the call in the final response.
    with client.responses.stream(
        input="Weather?", tool_choice="required", parallel_tool_calls=False, **kw
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    (call,) = final.output
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert call.type == "function_call" and args == call.arguments
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])


def test_previous_response_id_continues_the_conversation(server, client):
    first = client.responses.create(
        model="tiny",
        input="My name is Ada.",
        max_output_tokens=4,
        instructions="Be kind.",
        **GREEDY,
    )
    second = client.responses.create(
        model="tiny",
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=4,
        **GREEDY,
    )
    assert second.previous_response_id == first.id
    # Same prompt as the whole conversation sent at once (instructions not carried over).
    chat = _chat(
        server,
        model="tiny",
        max_tokens=4,
        **GREEDY,
        messages=[
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
    )
    assert second.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert second.output_text == chat["choices"][0]["message"]["content"]


def test_store_get_delete_and_bound(server, client):
    kept = client.responses.create(model="tiny", input="a", max_output_tokens=2)
    got = client.responses.retrieve(kept.id)
    assert got.id == kept.id and got.output_text == kept.output_text
    client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.retrieve(kept.id)
    assert err.value.body["param"] == "response_id"
    unstored = client.responses.create(model="tiny", input="b", max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    # Only the last STORE_SIZE are kept: the oldest is gone, previous_response_id too.
    ids = [
        client.responses.create(model="tiny", input=str(i), max_output_tokens=1).id
        for i in range(STORE_SIZE + 1)
    ]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    assert client.responses.retrieve(ids[-1]).id == ids[-1]
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="tiny", input="x", previous_response_id=ids[0])
    assert err.value.body["param"] == "previous_response_id"
    r = httpx.delete(f"{server.base_url}/v1/responses/resp_nope", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found"


def test_response_store_unit():
    store = ResponseStore(max_responses=2)
    for rid in ("a", "b"):
        store.put(StoredResponse({"id": rid}, []))
    assert store.get("a") is not None  # a is now the most recently used
    store.put(StoredResponse({"id": "c"}, []))
    assert store.get("b") is None and store.get("a") and store.get("c") and len(store) == 2
    assert store.delete("a") and not store.delete("a")
    with pytest.raises(ValueError, match="max_responses"):
        ResponseStore(0)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input"),
        ({"input": "x", "reasoning": {"summary": "auto"}}, "reasoning"),
        ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
        ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "truncation": "auto"}, "truncation"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"input": "x", "max_output_tokens": 5000}, "max_tokens"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text"),
    ],
)
def test_bad_requests_are_400_in_openai_shape(server, body, param):
    r = httpx.post(f"{server.base_url}/v1/responses", json={"model": "tiny", **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err


def test_errors_through_the_sdk(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="gpt-nope", input="x")
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="tiny", input=[])


def test_engine_failure_is_an_openai_error(server, client):
    with pytest.raises(openai.InternalServerError):
        client.responses.create(model="tiny", input=f"{FAULT} now", max_output_tokens=5)
    # Streamed: created, in_progress, then `error` and response.failed (nothing stored).
    with client.responses.stream(model="tiny", input=f"{FAULT} now", max_output_tokens=5) as stream:
        events = list(stream)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "error",
        "response.failed",
    ]
    assert events[-1].response.status == "failed" and events[-1].response.error.message
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(events[0].response.id)


def test_no_blocks_leak(server):
    assert wait_idle(server.base_url)["pagedllm:kv_cache_usage_perc"] == 0
