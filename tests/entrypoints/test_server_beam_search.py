"""`use_beam_search` on /v1/completions through `pagedllm serve` and the openai client: the
n beams of each prompt equal HF `generate(num_beams=n)` (tokens, order, EOS left out of the
text), logprobs / echo / return_token_ids shapes, the 400s, and no KV block held after."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
import torch
import transformers
from server_harness import TINY_SERVER_ARGS, start_server, wait_idle

from tests.beam_search_reference import EOS, PROMPTS, hf_beams, make_beam_checkpoint

BEAMS, MAX_TOKENS = 4, 12


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_tokenizer):
    return make_beam_checkpoint(tmp_path_factory.mktemp("beam_server"), tiny_tokenizer)


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    args = [*TINY_SERVER_ARGS, "--served-model-name", "tiny", "--block-size", "4"]
    srv = start_server(tmp_path_factory, str(model_dir), args)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def beam_search(client, prompt, **extra):
    n = extra.pop("n", BEAMS)
    max_tokens = extra.pop("max_tokens", MAX_TOKENS)
    return client.completions.create(
        model="tiny",
        prompt=prompt,
        n=n,
        max_tokens=max_tokens,
        extra_body={"use_beam_search": True, "return_token_ids": True, **extra},
    )


@pytest.mark.parametrize(
    "length_penalty, early_stopping", [(1.0, False), (0.0, True), (2.0, "never")]
)
def test_beams_equal_hf(server, client, hf_model, tiny_tokenizer, length_penalty, early_stopping):
    prompts = [tiny_tokenizer.encode(t) for t in PROMPTS]
    resp = beam_search(
        client, prompts, length_penalty=length_penalty, early_stopping=early_stopping
    )
    assert len(resp.choices) == BEAMS * len(prompts)
    assert [c.index for c in resp.choices] == list(range(BEAMS * len(prompts)))
    reasons = set()
    for p, prompt in enumerate(prompts):
        want, _ = hf_beams(
            hf_model,
            prompt,
            BEAMS,
            MAX_TOKENS,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
        )
        got = resp.choices[p * BEAMS : (p + 1) * BEAMS]
        assert [c.token_ids for c in got] == want
        for c in got:
            assert c.prompt_token_ids == prompt
            assert c.finish_reason == ("stop" if c.token_ids[-1] == EOS else "length")
            kept = c.token_ids[:-1] if c.finish_reason == "stop" else c.token_ids
            assert c.text == tiny_tokenizer.decode(kept, skip_special_tokens=True)
            reasons.add(c.finish_reason)
    assert reasons == {"stop", "length"}
    assert resp.usage.prompt_tokens == sum(map(len, prompts))
    assert resp.usage.completion_tokens == sum(len(c.token_ids) for c in resp.choices)
    assert wait_idle(server.base_url)["pagedllm:kv_cache_usage_perc"] == 0


def test_text_prompt_logprobs_and_echo(client, tiny_tokenizer):
    text = PROMPTS[3]
    by_ids = beam_search(client, tiny_tokenizer.encode(text), n=2)
    resp = beam_search(client, text, n=2, logprobs=3)
    assert [c.token_ids for c in resp.choices] == [c.token_ids for c in by_ids.choices]
    for c in resp.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(c.token_ids)
        assert lp.text_offset[0] == 0
        for tok, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
            assert next(iter(top)) == tok and top[tok] == logprob  # the beam's token first
            assert len(top) <= 4
    echoed = beam_search(client, text, n=2, echo=True)
    assert [c.text for c in echoed.choices] == [text + c.text for c in by_ids.choices]


def test_beam_width_one_is_greedy(client, tiny_tokenizer):
    prompt = tiny_tokenizer.encode(PROMPTS[1])
    beam = beam_search(client, prompt, n=1, max_tokens=8).choices[0]
    greedy = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=8,
        temperature=0,
        extra_body={"return_token_ids": True},
    ).choices[0]
    assert beam.token_ids == greedy.token_ids


@pytest.mark.parametrize(
    "body, param, message",
    [
        ({"n": 0}, "n", "n must be an integer >= 1, got 0"),
        ({"max_tokens": 0}, "max_tokens", "max_tokens must be an integer >= 1, got 0"),
        ({"logprobs": -1}, "logprobs", "logprobs must be >= 0, got -1"),
        ({"logprobs": 21}, "logprobs", "logprobs must be <= max_logprobs (20"),
        ({"n": 11}, "n", "n 11 needs 22 logprobs per step; max_logprobs is 20"),
        ({"stream": True}, "stream", "stream is not supported with use_beam_search"),
        ({"temperature": 0.7}, "temperature", "temperature=0.7 is not supported"),
        ({"top_p": 0.5}, "top_p", "top_p=0.5 is not supported"),
        ({"guided_regex": "a+"}, "guided_regex", "structured output is not supported"),
        ({"stop": ["x"]}, "stop", "stop=['x'] is not supported"),
        ({"length_penalty": "long"}, None, "length_penalty"),
        ({"early_stopping": "sometimes"}, None, "early_stopping"),
        ({"echo": True, "logprobs": 1}, "echo", "echo with logprobs is not supported"),
        ({"max_tokens": 1021}, "max_tokens", "1025 > max_model_len 1024"),
    ],
)
def test_errors(server, body, param, message):
    r = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"model": "tiny", "prompt": "Hello", "max_tokens": 4, "use_beam_search": True, **body},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert message in err["message"]
    if param is not None:
        assert err["param"] == param
    assert err["type"] == "invalid_request_error"


def test_chat_refuses_beam_search(server):
    r = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        json={
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "use_beam_search": True,
        },
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "use_beam_search"


def test_client_hanging_up_ends_the_search(server):
    """The route is cancelled on disconnect: the step in flight is aborted, no step follows."""
    body = {
        "model": "tiny",
        "prompt": "Hello",
        "n": 4,
        "max_tokens": 1000,
        "use_beam_search": True,
        "ignore_eos": True,
    }
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=1.0)
    first = wait_idle(server.base_url)
    assert first["pagedllm:num_requests_running"] == 0
    assert first["pagedllm:kv_cache_usage_perc"] == 0
    time.sleep(0.5)
    again = wait_idle(server.base_url)
    finished = [k for k in again if k.startswith("pagedllm:request_success_total")]
    assert finished and all(again[k] == first[k] for k in finished)


def test_one_log_line_per_search(server, client):
    client.completions.create(
        model="tiny",
        prompt="Hello",
        n=2,
        max_tokens=6,
        extra_body={"use_beam_search": True, "request_id": "beam-log", "ignore_eos": True},
    )
    lines = [line for line in server.log().splitlines() if "request cmpl-beam-log" in line]
    assert len(lines) == 1, lines  # the first step's submission only (6 steps ran)
