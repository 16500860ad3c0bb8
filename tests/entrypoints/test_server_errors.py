"""Every error answer has OpenAI's shape and status, and the server keeps serving after it with
no KV block leaked."""

from __future__ import annotations

import httpx
import openai
import pytest
from server_harness import TINY_SERVER_ARGS, start_server, wait_idle

MAX_LEN = 256


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    args = [a if a != "1024" else str(MAX_LEN) for a in TINY_SERVER_ARGS]
    srv = start_server(tmp_path_factory, tiny_model_path, args)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def _error_shape(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"]
    return err


@pytest.mark.parametrize(("body", "param"), [
    ({"top_p": 7}, "top_p"),
    ({"temperature": -1}, "temperature"),
    ({"n": 0}, "n"),
    ({"logprobs": 50}, "logprobs"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"stop": [""]}, None),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, 2, 10**6]}, "prompt"),
    ({"max_tokens": "many"}, "max_tokens"),
    ({"prompt": {"not": "a prompt"}}, "prompt"),
    ({"logit_bias": {"100000": 1.0}}, "logit_bias"),
])
def test_invalid_completion_params_are_400(server, body, param):
    req = {"prompt": "hi", "max_tokens": 4, **body}
    for stream in (False, True):
        r = httpx.post(f"{server.base_url}/v1/completions", json={**req, "stream": stream})
        err = _error_shape(r, 400)
        assert err["type"] == "invalid_request_error"
        if param is not None:
            assert err["param"] == param, err


def test_openai_client_raises_bad_request(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model, prompt="hi", top_p=7)
    assert "top_p" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model, messages=[], max_tokens=3)


def test_prompt_too_long_gives_token_counts(server):
    ids = list(range(10, 10 + MAX_LEN + 4))
    err = _error_shape(httpx.post(f"{server.base_url}/v1/completions",
                                  json={"prompt": ids, "max_tokens": 1}), 400)
    assert f"{MAX_LEN + 4} tokens" in err["message"] and str(MAX_LEN) in err["message"]
    # prompt + max_tokens over the limit is refused up front, as vLLM does
    err = _error_shape(httpx.post(f"{server.base_url}/v1/completions",
                                  json={"prompt": ids[:200], "max_tokens": 100}), 400)
    assert "200" in err["message"] and "100" in err["message"] and "300" in err["message"]
    err = _error_shape(httpx.post(f"{server.base_url}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "word " * 400}], "max_tokens": 5}), 400)
    assert err["code"] == "context_length_exceeded"


def test_malformed_json_and_schema_errors_are_400(server):
    r = httpx.post(f"{server.base_url}/v1/completions", content=b'{"prompt": "hi",',
                   headers={"content-type": "application/json"})
    assert "JSON" in _error_shape(r, 400)["message"]
    r = httpx.post(f"{server.base_url}/v1/completions", json={"max_tokens": 3})
    assert _error_shape(r, 400)["param"] == "prompt"
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json={"messages": "hello"})
    assert _error_shape(r, 400)["param"] == "messages"
    r = httpx.post(f"{server.base_url}/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})
    assert _error_shape(r, 400)["param"] == "top_logprobs"
    r = httpx.post(f"{server.base_url}/detokenize", json={"tokens": [10**7]})
    assert _error_shape(r, 400)["param"] == "tokens"


def test_unknown_model_and_route_are_404(server, client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-17", prompt="hi", max_tokens=2)
    r = httpx.post(f"{server.base_url}/v1/chat/completions",
                   json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert _error_shape(r, 404)["code"] == "model_not_found"
    _error_shape(httpx.get(f"{server.base_url}/v1/nothing-here"), 404)


def test_server_still_serves_and_no_blocks_leak(server, client, model):
    out = client.completions.create(model=model, prompt="still alive", max_tokens=5,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 5
    m = wait_idle(server.base_url)
    assert m["pagedllm:kv_cache_usage_perc"] == 0
    assert m["pagedllm:num_requests_running"] == 0
