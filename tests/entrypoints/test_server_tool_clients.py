"""Tool calls through the real client libraries agents use (issue 32): the openai SDK's
streaming helper with a pydantic tool, instructor's partial streaming in TOOLS mode, and
LangChain's `bind_tools`. The tiny random model writes whatever the grammar lets it, so
these check the wire shape and the grammar, not the model."""

from __future__ import annotations

import json
import re
from typing import Literal

import httpx
import instructor
import openai
import pytest
from pydantic import BaseModel, Field
from server_harness import TINY_SERVER_ARGS, parse_sse, start_server

MSGS = [{"role": "user", "content": "What's the weather in Paris?"}]


class GetWeather(BaseModel):
    """Weather in a city."""

    city: str = Field(min_length=1, max_length=10)
    unit: Literal["celsius", "fahrenheit"]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(
        tmp_path_factory,
        tiny_model_path,
        [*TINY_SERVER_ARGS, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
        name="tool_clients",
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def test_named_tool_stream_has_one_entry_per_index_per_chunk(server, model):
    r = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        timeout=60,
        json={
            "model": model,
            "messages": MSGS,
            "stream": True,
            "seed": 3,
            "temperature": 1.0,
            "max_tokens": 80,
            "tools": [openai.pydantic_function_tool(GetWeather)],
            "tool_choice": {"type": "function", "function": {"name": "GetWeather"}},
        },
    )
    events = [e for e in parse_sse(r.text) if e != "[DONE]"]
    entries = [
        tc for e in events for c in e["choices"] for tc in c["delta"].get("tool_calls") or []
    ]
    for e in events:
        for c in e["choices"]:
            indexes = [tc["index"] for tc in c["delta"].get("tool_calls") or []]
            assert len(indexes) == len(set(indexes)), e
    assert entries[0]["id"] and entries[0]["function"]["name"] == "GetWeather"
    assert all("id" not in tc and "name" not in tc["function"] for tc in entries[1:])
    GetWeather.model_validate_json("".join(tc["function"]["arguments"] for tc in entries))


def test_openai_stream_helper_parses_named_pydantic_tool(client, model):
    for seed in (1, 2):
        with client.chat.completions.stream(
            model=model,
            messages=MSGS,
            seed=seed,
            temperature=1.0,
            max_tokens=80,
            tools=[openai.pydantic_function_tool(GetWeather)],
            tool_choice={"type": "function", "function": {"name": "GetWeather"}},
        ) as stream:
            kinds = {event.type for event in stream}
            final = stream.get_final_completion()
        assert "tool_calls.function.arguments.done" in kinds
        (call,) = final.choices[0].message.tool_calls
        assert call.function.name == "GetWeather"
        assert isinstance(call.function.parsed_arguments, GetWeather)
        assert final.choices[0].finish_reason == "tool_calls"


def test_instructor_create_partial_in_tools_mode(client, model):
    inst = instructor.from_openai(client, mode=instructor.Mode.TOOLS)
    partials = list(
        inst.chat.completions.create_partial(
            model=model,
            response_model=GetWeather,
            messages=MSGS,
            max_tokens=80,
            seed=5,
            temperature=1.0,
            max_retries=0,
        )
    )
    assert len(partials) > 1  # arrived in pieces, not at the end
    last = partials[-1]
    GetWeather.model_validate(last.model_dump())
    # the whole-answer path on the same request gives a valid object too
    full = inst.chat.completions.create(
        model=model,
        response_model=GetWeather,
        messages=MSGS,
        max_tokens=80,
        seed=5,
        temperature=1.0,
        max_retries=0,
    )
    # (create_partial sends Partial[GetWeather]: the tool "PartialGetWeather" without the
    # description, another prompt and grammar, so its sample need not equal this one's)
    assert isinstance(full, GetWeather)


class Forecast(BaseModel):
    """Weather in a city; LangChain leaves `additionalProperties` out of this schema."""

    city: str = Field(max_length=8)
    unit: Literal["celsius", "fahrenheit"]


def test_langchain_bind_tools_named_choice_gives_valid_calls(server, model):
    # Compiled to the letter, the tiny model invents keys after the declared ones until
    # max_tokens cuts the JSON (every seed here did): strict grammars by default (#32).
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        base_url=f"{server.base_url}/v1",
        api_key="unused",
        model=model,
        max_tokens=60,
        temperature=1.0,
        max_retries=0,
    )
    bound = llm.bind_tools([Forecast], tool_choice="Forecast")
    (tool,) = bound.kwargs["tools"]
    assert "additionalProperties" not in json.dumps(tool["function"]["parameters"])
    for seed in range(4):
        msg = bound.invoke("Weather in Paris?", seed=seed)
        assert not msg.invalid_tool_calls, msg.invalid_tool_calls
        (call,) = msg.tool_calls
        assert call["name"] == "Forecast" and set(call["args"]) == {"city", "unit"}


def test_strict_response_format_admits_no_undeclared_keys(client, model):
    schema = Forecast.model_json_schema()
    assert "additionalProperties" not in schema
    for seed in range(3):
        out = client.chat.completions.create(
            model=model,
            messages=MSGS,
            max_tokens=60,
            temperature=1.0,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "f", "schema": schema, "strict": True},
            },
        )
        assert set(json.loads(out.choices[0].message.content)) == {"city", "unit"}


def test_strict_response_format_on_completions_too(client, model):
    """vLLM's response_format on /v1/completions: strict: true compiles strictly there too."""
    schema = Forecast.model_json_schema()
    for seed in range(3):
        out = client.completions.create(
            model=model,
            prompt="Weather in Paris as JSON:",
            max_tokens=60,
            temperature=1.0,
            seed=seed,
            extra_body={
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "f", "schema": schema, "strict": True},
                }
            },
        )
        assert set(json.loads(out.choices[0].text)) == {"city", "unit"}


HERMES_TWO = (
    '<tool_call>{"name": "GetWeather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    '</tool_call><tool_call>{"name": "GetWeather", "arguments": {"city": "Rome", '
    '"unit": "celsius"}}</tool_call>'
)


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_under_auto_keeps_the_first(client, model, stream):
    # The tiny model is scripted (a regex) to write two Hermes calls.
    body = dict(
        model=model,
        messages=MSGS,
        max_tokens=300,
        seed=1,
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="auto",
        extra_body={"structured_outputs": {"regex": re.escape(HERMES_TWO)}},
    )
    for parallel, cities in ((True, ["Paris", "Rome"]), (False, ["Paris"])):
        if stream:
            with client.chat.completions.stream(parallel_tool_calls=parallel, **body) as s:
                for _ in s:
                    pass
                final = s.get_final_completion()
        else:
            final = client.chat.completions.create(parallel_tool_calls=parallel, **body)
        calls = final.choices[0].message.tool_calls
        assert [json.loads(c.function.arguments)["city"] for c in calls] == cities
        assert final.choices[0].finish_reason == "tool_calls"
