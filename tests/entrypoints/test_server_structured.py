"""Structured output, tool calling and request-field handling through a real server with the
tiny random model: whatever garbage it would write, constrained answers must validate."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from server_harness import TINY_SERVER_ARGS, parse_sse, start_server, wait_idle

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "structured_output"))
from schemas import SCHEMAS  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 10},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "pattern": "^UTC[+-][0-9]$"}},
        "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, CLOCK]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MSGS = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path,
                       [*TINY_SERVER_ARGS, "--enable-auto-tool-choice",
                        "--tool-call-parser", "hermes"], name="structured")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/{path}", json=body, timeout=60)


def _chat(server, **body) -> dict:
    r = _post(server, "chat/completions", {"messages": MSGS, "max_tokens": 200, **body})
    assert r.status_code == 200, r.text
    return r.json()


# ----------------------------------------------------------- structured output
@pytest.mark.parametrize("name", ["person", "nested_address", "array_of_objects"])
def test_response_format_json_schema(server, name):
    for seed in (1, 2):
        out = _chat(server, temperature=1.0, seed=seed, response_format={
            "type": "json_schema",
            "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}})
        choice = out["choices"][0]
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMAS[name])


def _token_id(server, text: str) -> int:
    (tid,) = httpx.post(f"{server.base_url}/tokenize",
                        json={"prompt": text, "add_special_tokens": False}).json()["tokens"]
    return tid


def test_response_format_json_object_and_completions(server):
    # "Any object" is unbounded; a logit_bias on '"' and '}' (applied on top of the grammar
    # mask) makes the tiny model close what it opens, so the answer completes.
    bias = {str(_token_id(server, c)): 100 for c in '"}'}
    out = _chat(server, temperature=0, response_format={"type": "json_object"}, logit_bias=bias)
    assert isinstance(json.loads(out["choices"][0]["message"]["content"]), dict)
    r = _post(server, "completions", {"prompt": "x", "max_tokens": 100, "n": 2, "seed": 3,
                                      "response_format": {"type": "json_schema", "json_schema": {
                                          "name": "p", "schema": SCHEMAS["enum_status"]}}})
    for c in r.json()["choices"]:
        jsonschema.validate(json.loads(c["text"]), SCHEMAS["enum_status"])


@pytest.mark.parametrize(("spec", "check"), [
    ({"regex": r"[a-z]{3}-[0-9]{3}"}, lambda t: re.fullmatch(r"[a-z]{3}-[0-9]{3}", t)),
    ({"choice": ["alpha", "beta"]}, lambda t: t in ("alpha", "beta")),
    ({"grammar": 'start: "go " DIR\nDIR: "north" | "south"'},
     lambda t: t in ("go north", "go south")),
    ({"json": SCHEMAS["tags_array"]},
     lambda t: jsonschema.validate(json.loads(t), SCHEMAS["tags_array"]) is None),
])
def test_structured_outputs_on_both_endpoints(server, client, spec, check):
    for stream in (False, True):
        comp = client.completions.create(model=client.models.list().data[0].id,
                                         prompt="Answer:", max_tokens=60, temperature=1.0,
                                         seed=5, stream=stream,
                                         extra_body={"structured_outputs": spec})
        text = ("".join(c.choices[0].text for c in comp) if stream else comp.choices[0].text)
        assert check(text), text
    out = _chat(server, temperature=1.0, seed=6, structured_outputs=spec)
    assert check(out["choices"][0]["message"]["content"])


def test_guided_names_map_to_structured_outputs(server):
    out = _chat(server, temperature=0, guided_choice=["up", "down"])
    assert out["choices"][0]["message"]["content"] in ("up", "down")
    out = _chat(server, temperature=0, guided_regex="[0-9]{4}")
    assert re.fullmatch("[0-9]{4}", out["choices"][0]["message"]["content"])


class Pet(BaseModel):
    name: str = Field(max_length=8)
    species: Literal["cat", "dog", "owl"]
    age: int = Field(ge=0, le=30)
    vaccinated: bool


def test_openai_parse_with_pydantic_model(client):
    model = client.models.list().data[0].id
    for seed in (1, 2, 3):
        completion = client.chat.completions.parse(
            model=model, messages=MSGS, response_format=Pet, max_tokens=120, seed=seed)
        pet = completion.choices[0].message.parsed
        assert isinstance(pet, Pet)
        assert len(pet.name) <= 8 and 0 <= pet.age <= 30


def test_compile_error_is_400_with_backend_message(server):
    r = _post(server, "completions", {"prompt": "x", "structured_outputs": {"regex": "a(b"}})
    assert r.status_code == 400 and "unclosed group" in r.json()["error"]["message"]
    r = _post(server, "chat/completions", {"messages": MSGS, "response_format": {
        "type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "strin"}}}})
    assert r.status_code == 400 and "strin" in r.json()["error"]["message"]
    r = _post(server, "completions", {"prompt": "x", "structured_outputs": {"regex": "a",
                                                                            "choice": ["b"]}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs"
    r = _post(server, "completions", {"prompt": "x", "structured_outputs": {"regexp": "a"}})
    assert r.status_code == 400 and "regexp" in r.json()["error"]["message"]


# --------------------------------------------------------------- tool calling
def _check_call(call: dict) -> None:
    assert call["type"] == "function" and call["id"]
    name = call["function"]["name"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), PARAMS[name])


def test_tool_choice_required_returns_valid_calls(client):
    model = client.models.list().data[0].id
    for seed in (1, 2, 3):
        out = client.chat.completions.create(model=model, messages=MSGS, tools=TOOLS,
                                             tool_choice="required", seed=seed, max_tokens=200)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls
        assert calls
        for call in calls:
            _check_call(call.model_dump())


def test_named_tool_choice_and_parallel_false(server):
    out = _chat(server, tools=TOOLS, temperature=1.0, seed=4,
                tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = out["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_time"]
    _check_call(calls[0])
    out = _chat(server, tools=TOOLS, temperature=1.0, seed=4, tool_choice="required",
                parallel_tool_calls=False)
    assert len(out["choices"][0]["message"]["tool_calls"]) == 1


def _stream_calls(server, body: dict) -> tuple[str, list[dict], str]:
    r = _post(server, "chat/completions", {"messages": MSGS, "max_tokens": 200,
                                           "stream": True, **body})
    assert r.status_code == 200, r.text
    calls: dict[int, dict] = {}
    content, finish = "", None
    for ev in parse_sse(r.text):
        if ev == "[DONE]":
            continue
        for ch in ev["choices"]:
            d = ch["delta"]
            content += d.get("content") or ""
            for tc in d.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function", {})
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            finish = ch.get("finish_reason") or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("tool_choice", [
    "required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_tool_call_deltas_reassemble(server, tool_choice):
    # A seed whose sample ends its calls within max_tokens (with "required" the random
    # model may go on calling): what is tested is that the stream reassembles to it.
    for seed in range(9, 40):
        body = {"tools": TOOLS, "tool_choice": tool_choice, "temperature": 1.0, "seed": seed}
        full = _chat(server, **body)["choices"][0]
        if full["finish_reason"] == "tool_calls":
            break
    _, streamed, finish = _stream_calls(server, body)
    assert finish == full["finish_reason"] == "tool_calls"
    want = [(c["function"]["name"], c["function"]["arguments"])
            for c in full["message"]["tool_calls"]]
    assert [(c["name"], c["arguments"]) for c in streamed] == want
    assert all(c["id"] for c in streamed)


HERMES = ('<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", '
          '"unit": "celsius"}}</tool_call>')


def test_auto_with_hermes_parser(server):
    # The tiny model is scripted with a regex that spells out a Hermes-style call.
    body = {"tools": TOOLS, "tool_choice": "auto", "temperature": 1.0, "seed": 1,
            "structured_outputs": {"regex": re.escape(HERMES)}}
    choice = _chat(server, **body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    content, streamed, finish = _stream_calls(server, body)
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in streamed] == [
        ("get_weather", call["function"]["arguments"])]
    # plain text under auto stays content
    body["structured_outputs"] = {"regex": "Hello there"}
    choice = _chat(server, **body)["choices"][0]
    assert choice["message"]["content"] == "Hello there"
    assert not choice["message"]["tool_calls"] and choice["finish_reason"] == "stop"


def test_conversation_with_tool_calls_and_tool_results(server):
    msgs = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"}]
    r = _post(server, "chat/completions", {"messages": msgs, "tools": TOOLS,
                                           "tool_choice": "none", "max_tokens": 5})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None


@pytest.mark.parametrize(("body", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
])
def test_bad_tool_requests_are_400(server, body, param):
    r = _post(server, "chat/completions", {"messages": MSGS, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


# --------------------------------------------------- fields we do not implement
@pytest.mark.parametrize(("path", "field", "value"), [
    ("chat/completions", "use_beam_search", True),  # completions implement it (#33)
    ("completions", "best_of", 3),
    ("chat/completions", "length_penalty", 0.5),
    ("completions", "truncate_prompt_tokens", 4),
    ("completions", "logits_processors", ["x"]),
    ("chat/completions", "functions", [{"name": "f"}]),
    ("chat/completions", "function_call", "auto"),
    ("chat/completions", "audio", {"voice": "alloy"}),
    ("chat/completions", "modalities", ["text", "audio"]),
    ("chat/completions", "web_search_options", {}),
    ("chat/completions", "continue_final_message", True),
    ("chat/completions", "response_format", {"type": "structural_tag"}),
    ("completions", "thinking_token_budget", 8),
    ("completions", "logprob_token_ids", [3]),
    ("completions", "truncation_side", "left"),
    ("chat/completions", "repetition_detection", {"max_pattern_size": 4}),
])
def test_unimplemented_fields_are_400_naming_them(server, path, field, value):
    body = {"prompt": "x"} if path == "completions" else {"messages": MSGS}
    r = _post(server, path, {**body, "max_tokens": 2, field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and field in err["message"]


def test_unknown_fields_are_ignored_and_logged(server):
    r = _post(server, "completions", {"prompt": "x", "max_tokens": 2, "frobnicate": 1,
                                      "zz_extra": "y", "user": "me", "store": False})
    assert r.status_code == 200, r.text
    assert "ignoring unknown request fields: frobnicate, zz_extra" in server.log()


def test_logit_bias_and_allowed_token_ids_via_api(server):
    r = _post(server, "completions", {"prompt": "x", "max_tokens": 6, "temperature": 0,
                                      "logit_bias": {"77": 100}})
    assert r.status_code == 200, r.text
    want = httpx.post(f"{server.base_url}/detokenize", json={"tokens": [77] * 6}).json()
    assert r.json()["choices"][0]["text"] == want["prompt"]
    r = _post(server, "completions", {"prompt": "x", "max_tokens": 2,
                                      "logit_bias": {"99999": 1}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"
    r = _post(server, "completions", {"prompt": "x", "max_tokens": 4, "temperature": 0,
                                      "allowed_token_ids": [70, 71], "bad_words": ["zz"]})
    assert r.status_code == 200, r.text


def test_no_blocks_leak(server):
    m = wait_idle(server.base_url)
    assert m["pagedllm:kv_cache_usage_perc"] == 0
    assert m["pagedllm:num_requests_running"] == 0
