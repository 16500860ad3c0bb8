"""Hostile input against a real server (tiny model), issue #28: every case is answered with the
expected 4xx (never a 5xx) in OpenAI's error shape, and the server stays clean after them.
The heavy ones (a 7 MB prompt, 20,000 prompts, a pathological chat template, a huge JSON
schema) run in test_server_hostile_load.py, which checks /health and another stream meanwhile.
"""

from __future__ import annotations

import json

import httpx
import pytest
from server_harness import TINY_SERVER_ARGS, start_server, wait_idle

ARGS = [*TINY_SERVER_ARGS, "--max-model-len", "256", "--max-num-seqs", "32",
        "--max-prompts-per-request", "64", "--allowed-hosts", "127.0.0.1", "localhost"]

C, CHAT, TOK, DETOK = "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"
OK = {"prompt": "hi", "max_tokens": 2}
MSG = [{"role": "user", "content": "hi"}]
JSON_CT = {"Content-Type": "application/json"}


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


# (id, path, body: dict to send as JSON | bytes sent as is, headers, expected status, param)
CASES = [
    # lone surrogates, nesting, non-finite floats (raw bodies: Python's JSON parser takes them)
    ("surrogate-prompt", C, {"prompt": "a\ud800b", "max_tokens": 2}, None, 400, None),
    ("surrogate-model", C, {"prompt": "hi", "model": "m\udc00"}, None, 400, None),
    ("surrogate-key", C, {"prompt": "hi", "\ud800": 1}, None, 400, None),
    ("surrogate-stop", C, {**OK, "stop": ["\ud83d"]}, None, 400, None),
    ("deep-structured-900", C, {**OK, "structured_outputs": {"json": nested(450)}}, None,
     400, None),
    ("deep-structured-70", C, {**OK, "structured_outputs": {"json": nested(35)}}, None,
     400, None),
    ("deep-list", C, {**OK, "prompt": json.loads("[" * 200 + "]" * 200)}, None, 400, None),
    ("nan-temperature", C, b'{"prompt": "hi", "temperature": NaN}', JSON_CT, 400,
     "temperature"),
    ("inf-temperature", C, b'{"prompt": "hi", "temperature": Infinity}', JSON_CT, 400,
     "temperature"),
    ("neg-inf-top-p", C, b'{"prompt": "hi", "top_p": -Infinity}', JSON_CT, 400, "top_p"),
    ("nan-presence", C, b'{"prompt": "hi", "presence_penalty": NaN}', JSON_CT, 400,
     "presence_penalty"),
    ("nan-logit-bias", C, b'{"prompt": "hi", "logit_bias": {"5": NaN}}', JSON_CT, 400,
     "logit_bias"),
    ("nan-chat-temp", CHAT, b'{"messages": [{"role": "user", "content": "x"}], '
     b'"temperature": Infinity}', JSON_CT, 400, "temperature"),
    # strict types: no coercion
    ("bool-token-ids", C, {"prompt": [True, False], "max_tokens": 2}, None, 400, "prompt"),
    ("string-max-tokens", C, {"prompt": "hi", "max_tokens": "10"}, None, 400, "max_tokens"),
    ("float-max-tokens", C, {"prompt": "hi", "max_tokens": 10.5}, None, 400, "max_tokens"),
    ("string-n", C, {**OK, "n": "2"}, None, 400, "n"),
    ("string-stream", C, {**OK, "stream": "yes"}, None, 400, "stream"),
    ("string-seed", C, {**OK, "seed": "7"}, None, 400, "seed"),
    ("string-temperature", C, {**OK, "temperature": "0.5"}, None, 400, "temperature"),
    ("bool-logprobs", C, {**OK, "logprobs": True}, None, 400, "logprobs"),
    ("int-stop", C, {**OK, "stop": 5}, None, 400, "stop"),
    ("string-usage", C, {**OK, "stream": True, "stream_options": {"include_usage": "yes"}},
     None, 400, "stream_options"),
    ("chat-string-max", CHAT, {"messages": MSG, "max_completion_tokens": "5"}, None, 400,
     "max_completion_tokens"),
    ("chat-int-role", CHAT, {"messages": [{"role": 1, "content": "x"}]}, None, 400,
     "messages"),
    ("detok-bools", DETOK, {"tokens": [True]}, None, 400, "tokens"),
    ("detok-strings", DETOK, {"tokens": ["a"]}, None, 400, "tokens"),
    # shapes and ranges
    ("prompt-object", C, {"prompt": {}, "max_tokens": 2}, None, 400, "prompt"),
    ("prompt-null", C, {"prompt": None}, None, 400, "prompt"),
    ("prompt-empty-list", C, {"prompt": []}, None, 400, "prompt"),
    ("prompt-empty-inner", C, {"prompt": [[]]}, None, 400, "prompt"),
    ("prompt-neg-id", C, {"prompt": [-1]}, None, 400, "prompt"),
    ("prompt-huge-id", C, {"prompt": [10**12]}, None, 400, "prompt"),
    ("prompt-float-id", C, {"prompt": [1.5]}, None, 400, "prompt"),
    ("prompt-mixed", C, {"prompt": ["a", 1]}, None, 400, "prompt"),
    ("too-many-prompts", C, {"prompt": [[5, 6]] * 65, "max_tokens": 1}, None, 400, "prompt"),
    ("max-tokens-neg", C, {"prompt": "hi", "max_tokens": -1}, None, 400, None),
    ("max-tokens-huge", C, {"prompt": "hi", "max_tokens": 10**9}, None, 400, "max_tokens"),
    ("n-zero", C, {**OK, "n": 0}, None, 400, "n"),
    ("logprobs-huge", C, {**OK, "logprobs": 10**6}, None, 400, "logprobs"),
    ("seed-huge", C, {**OK, "seed": 2**70}, None, 400, "seed"),
    ("stop-id-huge", C, {**OK, "stop_token_ids": [10**12]}, None, 400, "stop_token_ids"),
    ("allowed-neg", C, {**OK, "allowed_token_ids": [-5]}, None, 400, "allowed_token_ids"),
    ("cache-salt-empty", C, {**OK, "cache_salt": ""}, None, 400, None),
    ("bad-regex", C, {**OK, "structured_outputs": {"regex": "("}}, None, 400, None),
    ("echo-logprobs-huge", C, {**OK, "echo": True, "logprobs": 10**6}, None, 400, "logprobs"),
    ("suffix", C, {**OK, "suffix": "x"}, None, 400, "suffix"),
    ("best-of", C, {**OK, "best_of": 3}, None, 400, "best_of"),
    # fields accepted and ignored before #28: each a 400 naming it
    ("thinking-budget", C, {**OK, "thinking_token_budget": 10}, None, 400,
     "thinking_token_budget"),
    ("logprob-token-ids", C, {**OK, "logprob_token_ids": [1, 2]}, None, 400,
     "logprob_token_ids"),
    ("truncation-side", C, {**OK, "truncation_side": "left"}, None, 400, "truncation_side"),
    ("repetition-detection", C, {**OK, "repetition_detection": {"max_pattern_size": 3}}, None,
     400, "repetition_detection"),
    ("chat-thinking-budget", CHAT, {"messages": MSG, "thinking_token_budget": 5}, None, 400,
     "thinking_token_budget"),
    ("priority-without-policy", C, {**OK, "priority": 3}, None, 400, "priority"),
    ("priority-string", C, {**OK, "priority": "high"}, None, 400, "priority"),
    ("request-id-long", C, {**OK, "request_id": "x" * 1000}, None, 400, "request_id"),
    ("request-id-newline", C, {**OK, "request_id": "a\nb"}, None, 400, "request_id"),
    ("request-id-header-long", C, {**OK}, {"X-Request-Id": "y" * 500}, 400, "request_id"),
    # chat templates and their kwargs (this server does not trust request templates)
    ("chat-template-refused", CHAT, {"messages": MSG, "chat_template": "{{ 'x' }}"}, None,
     400, "chat_template"),
    ("kwargs-tokenizer-kwargs", CHAT, {"messages": MSG, "chat_template_kwargs": {
        "tokenizer_kwargs": {"cache_dir": "/x"}}}, None, 400, "chat_template_kwargs"),
    ("kwargs-padding", CHAT, {"messages": MSG, "chat_template_kwargs": {
        "padding": "max_length", "max_length": 10**6}}, None, 400, "chat_template_kwargs"),
    ("kwargs-tokenize", CHAT, {"messages": MSG, "chat_template_kwargs": {"tokenize": False}},
     None, 400, "chat_template_kwargs"),
    ("chat-empty", CHAT, {"messages": []}, None, 400, "messages"),
    ("chat-surrogate", CHAT, {"messages": [{"role": "user", "content": "a\udfff"}]}, None,
     400, None),
    ("chat-image-part", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, None, 400, "messages"),
    ("chat-top-logprobs", CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 1000},
     None, 400, "top_logprobs"),
    ("chat-auto-tools", CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {
        "name": "f"}}], "tool_choice": "auto"}, None, 400, "tool_choice"),
    # bodies and headers
    ("not-json", C, b"{not json", JSON_CT, 400, None),
    ("json-array", C, b"[1, 2]", JSON_CT, 400, None),
    ("json-string", C, b'"hi"', JSON_CT, 400, None),
    ("text-plain", C, json.dumps(OK).encode(), {"Content-Type": "text/plain"}, 415, None),
    ("form", C, b"prompt=hi", {"Content-Type": "application/x-www-form-urlencoded"}, 415,
     None),
    ("no-content-type", C, json.dumps(OK).encode(), {"Content-Type": ""}, 415, None),
    ("tokenize-text-plain", TOK, b'{"prompt": "x"}', {"Content-Type": "text/plain"}, 415,
     None),
    ("bad-host", C, OK, {"Host": "evil.example"}, 400, None),
    ("bad-host-health", "/health", None, {"Host": "rebound.example:8000"}, 400, None),
    ("tokenize-surrogate", TOK, {"prompt": "\ud800"}, None, 400, None),
    ("tokenize-huge", TOK, {"prompt": "word " * 400_000}, None, 400, "prompt"),
    ("tokenize-chat-surrogate", TOK, {"messages": [{"role": "user", "content": "\udbff"}]},
     None, 400, None),
    ("detok-neg", DETOK, {"tokens": [-1]}, None, 400, "tokens"),
    ("unknown-model", C, {**OK, "model": "m" * 10_000}, None, 404, "model"),
    ("unknown-route", "/v1/nothing", {}, None, 404, None),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path, ARGS, name="hostile")
    yield srv
    srv.stop()


def send(url: str, path: str, body, headers: dict | None) -> httpx.Response:
    if body is None:
        return httpx.get(url + path, headers=headers, timeout=30)
    if not isinstance(body, bytes):  # ASCII JSON: lone surrogates travel as \ud800 escapes
        body, headers = json.dumps(body).encode(), {**JSON_CT, **(headers or {})}
    return httpx.post(url + path, content=body, headers=headers, timeout=30)


def test_at_least_60_cases():
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize(("path", "body", "headers", "status", "param"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hostile_input_is_a_4xx_in_openai_shape(server, path, body, headers, status, param):
    r = send(server.base_url, path, body, headers)
    assert r.status_code == status, r.text[:500]
    err = r.json()["error"]
    assert isinstance(err["message"], str) and len(err["message"]) < 3000, err
    assert {"type", "param", "code"} <= set(err)
    if param is not None:
        assert err["param"] == param, err


def test_method_not_allowed_says_allow_and_head_health(server):
    r = httpx.get(f"{server.base_url}/v1/completions")
    assert r.status_code == 405 and "POST" in r.headers["allow"]
    assert httpx.head(f"{server.base_url}/health").status_code == 200


def test_log_lines_stay_bounded(server):
    """A 200 KB stop string and a 200 KB prompt are accepted, and no log line carries them
    (the request line logs sizes, not contents)."""
    r = httpx.post(f"{server.base_url}/v1/completions", timeout=60, json={
        "prompt": [5, 6, 7], "max_tokens": 2, "stop": ["s" * 200_000]})
    assert r.status_code == 200, r.text[:300]
    longest = max(len(line) for line in server.log().splitlines())
    assert longest < 2000, longest


def test_after_hostile_input_the_server_is_clean(server):
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    m = wait_idle(server.base_url, timeout=30)
    assert m["pagedllm:num_requests_running"] == 0
    assert m["pagedllm:num_requests_waiting"] == 0
    assert m["pagedllm:kv_cache_usage_perc"] == 0
    assert m["pagedllm:invariant_violations_total"] == 0
    r = httpx.post(f"{server.base_url}/v1/completions", json=OK)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
