"""/v1/completions, /v1/chat/completions and the small endpoints, through the official `openai`
client against a real `pagedllm serve` process on a tiny random model."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
from server_harness import TINY_SERVER_ARGS, parse_sse, start_server, wait_idle


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(tmp_path_factory, tiny_model_path,
                       [*TINY_SERVER_ARGS, "--served-model-name", "tiny", "tiny-alias",
                        "--debug-steps"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


GREEDY = dict(model="tiny", temperature=0, ignore_eos=True)


def _complete(client, **kw):
    extra = {k: kw.pop(k) for k in ("ignore_eos", "top_k", "min_tokens", "stop_token_ids")
             if k in kw}
    return client.completions.create(**kw, extra_body=extra or None)


def _stream_text(client, **kw) -> tuple[dict[int, str], dict[int, str | None], list]:
    texts: dict[int, str] = {}
    reasons: dict[int, str | None] = {}
    chunks = list(_complete(client, stream=True, **kw))
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason is not None:
                assert c.index not in reasons, "finish_reason must appear only once"
                reasons[c.index] = c.finish_reason
    return texts, reasons, chunks


def test_models_version_health(server, client):
    ids = [m.id for m in client.models.list().data]
    assert ids == ["tiny", "tiny-alias"]
    assert httpx.get(f"{server.base_url}/version").json()["version"]
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_completion_usage_and_length(server, client):
    out = _complete(client, prompt="The capital of France is", max_tokens=12, **GREEDY)
    n_prompt = httpx.post(f"{server.base_url}/tokenize",
                          json={"prompt": "The capital of France is"}).json()["count"]
    assert out.object == "text_completion" and out.model == "tiny"
    assert out.choices[0].finish_reason == "length"
    assert out.usage.prompt_tokens == n_prompt
    assert out.usage.completion_tokens == 12
    assert out.usage.total_tokens == n_prompt + 12


def test_stream_equals_non_stream_greedy(client):
    kw = dict(prompt="Once upon a time", max_tokens=24, **GREEDY)
    full = _complete(client, **kw).choices[0]
    texts, reasons, chunks = _stream_text(client, **kw,
                                          stream_options={"include_usage": True})
    assert texts[0] == full.text
    assert reasons == {0: "length"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24


def test_stream_raw_sse_format(server):
    body = {"model": "tiny", "prompt": "Hello", "max_tokens": 5, "stream": True,
            "temperature": 0}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        assert r.headers["x-accel-buffering"] == "no"
        raw = r.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = parse_sse(raw)
    assert events[-1] == "[DONE]"
    finishes = [c["finish_reason"] for e in events[:-1] for c in e["choices"]]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])


def test_n2_seeded_stream_matches_non_stream(client):
    kw = dict(prompt="In the beginning", max_tokens=10, n=2, temperature=1.0, seed=7,
              model="tiny", ignore_eos=True)
    full = _complete(client, **kw)
    assert sorted(c.index for c in full.choices) == [0, 1]
    assert full.usage.completion_tokens == 20
    texts, reasons, _ = _stream_text(client, **kw)
    assert texts == {c.index: c.text for c in full.choices}
    assert reasons == {0: "length", 1: "length"}


def test_multiple_prompts_and_token_ids(client):
    tok_prompt = [5, 6, 7, 8]
    out = _complete(client, prompt=[tok_prompt, [9, 10]], max_tokens=3, n=2, **GREEDY)
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.prompt_tokens == 6 and out.usage.completion_tokens == 12
    texts, _, _ = _stream_text(client, prompt=["a b", "c d"], max_tokens=3, **GREEDY)
    assert set(texts) == {0, 1}


def _ascii_piece(text: str) -> str | None:
    m = re.search(r"[A-Za-z]{2,3}", text[2:])
    return m.group(0) if m else None


def test_stop_string(client):
    kw = dict(prompt="The meaning of life", max_tokens=40, **GREEDY)
    text = _complete(client, **kw).choices[0].text
    stop = _ascii_piece(text)
    assert stop, f"no ascii piece in {text!r}"
    out = _complete(client, stop=[stop], **kw).choices[0]
    assert out.finish_reason == "stop"
    assert out.text == text[:text.index(stop)]
    texts, reasons, _ = _stream_text(client, stop=[stop], **kw)
    assert texts[0] == out.text and reasons == {0: "stop"}


def test_echo(client):
    out = _complete(client, prompt="Echo me", max_tokens=4, echo=True, **GREEDY)
    assert out.choices[0].text.startswith("Echo me")
    texts, _, _ = _stream_text(client, prompt="Echo me", max_tokens=4, echo=True, **GREEDY)
    assert texts[0] == out.choices[0].text


def test_completion_logprobs(client):
    out = _complete(client, prompt="Numbers:", max_tokens=6, logprobs=3, **GREEDY).choices[0]
    lp = out.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert chosen <= 0 and 1 <= len(top) <= 4
        assert chosen == pytest.approx(max(top.values()))  # greedy picks the top token
    chunks = list(_complete(client, prompt="Numbers:", max_tokens=6, logprobs=3, stream=True,
                            **GREEDY))
    streamed = [t for ch in chunks for c in ch.choices if c.logprobs for t in c.logprobs.tokens]
    assert streamed == lp.tokens


def test_chat_non_stream_and_stream(client):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=10,
                                          temperature=0, extra_body={"ignore_eos": True})
    c = full.choices[0]
    assert full.object == "chat.completion" and c.message.role == "assistant"
    assert c.finish_reason == "length" and full.usage.completion_tokens == 10
    chunks = list(client.chat.completions.create(
        model="tiny", messages=msgs, max_completion_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == c.message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == 10


def test_chat_logprobs_and_n(client):
    out = client.chat.completions.create(
        model="tiny-alias", messages=[{"role": "user", "content": "Count"}], max_tokens=5,
        temperature=0, n=2, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1]
    assert out.choices[0].message.content == out.choices[1].message.content  # greedy
    content = out.choices[0].logprobs.content
    assert len(content) == 5
    for t in content:
        assert len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob)
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token


def test_tokenize_detokenize(server):
    r = httpx.post(f"{server.base_url}/tokenize", json={"prompt": "hello world"}).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == 1024
    back = httpx.post(f"{server.base_url}/detokenize", json={"tokens": r["tokens"]}).json()
    assert back["prompt"] == "hello world"
    chat = httpx.post(f"{server.base_url}/tokenize",
                      json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] > r["count"] - 10


def test_debug_steps_logged_and_idle_after(server):
    wait_idle(server.base_url)
    assert re.search(r"step \d+: prefill_tokens=\d+ decode_seqs=\d+ .*forward=.*kv_usage=",
                     server.log())
