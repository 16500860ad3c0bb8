"""Prompt logprobs through `pagedllm serve` (tiny random Llama, chunked prefill on): `echo` +
`logprobs` on /v1/completions in OpenAI's legacy shape (what lm-eval's loglikelihood tasks
send: token-id prompts, max_tokens=1, logprobs=1), `max_tokens=0` with echo (score only),
vLLM's `prompt_logprobs` field, streaming, and the 400s. Values against HF transformers."""

from __future__ import annotations

import httpx
import pytest
import torch
from server_harness import TINY_SERVER_ARGS, parse_sse, start_server

MAX_LOGPROBS = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_path):
    srv = start_server(
        tmp_path_factory,
        tiny_model_path,
        [
            *TINY_SERVER_ARGS,
            "--served-model-name",
            "tiny",
            "--max-num-batched-tokens",
            "16",
            "--max-logprobs",
            str(MAX_LOGPROBS),
            "--enable-tokenizer-info-endpoint",
        ],
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        tiny_llama_dir, dtype=torch.float32
    ).eval()

    @torch.inference_mode()
    def logprobs(ids: list[int]) -> torch.Tensor:
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)

    return logprobs


@pytest.fixture(scope="module")
def tok(tiny_tokenizer):
    return tiny_tokenizer


def post(server, body: dict, path: str = "completions") -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/{path}", json={"model": "tiny", **body}, timeout=60)


def ok(server, body: dict, path: str = "completions") -> dict:
    r = post(server, body, path)
    assert r.status_code == 200, r.text
    return r.json()


def token_str(tok, t: int) -> str:
    return tok.decode([t], skip_special_tokens=False)


def check_legacy(lp: dict, ids: list[int], ref: torch.Tensor, k: int, tok) -> None:
    """OpenAI's legacy columns for tokens `ids` (the prompt, then maybe completion tokens):
    null for the first token, each later one scored by the previous position's row."""
    n = len(ids)
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert lp["tokens"] == [token_str(tok, t) for t in ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    offsets = [0]
    for t in lp["tokens"][:-1]:
        offsets.append(offsets[-1] + len(t))
    assert lp["text_offset"] == offsets
    for p in range(1, n):
        row = ref[p - 1]
        assert lp["token_logprobs"][p] == pytest.approx(float(row[ids[p]]), abs=1e-4)
        expect: dict[str, float] = {}  # ids that decode alike: the likeliest is kept
        for t in [ids[p], *row.topk(k).indices.tolist()]:
            key = token_str(tok, t)
            expect[key] = max(float(row[t]), expect.get(key, -1e9))
        top = lp["top_logprobs"][p]
        assert set(top) == set(expect)
        for key, value in expect.items():
            assert top[key] == pytest.approx(value, abs=1e-4)


def test_lm_eval_loglikelihood_request(server, hf, tok):
    """lm-eval's request: a batch of token-id prompts, echo, max_tokens=1, logprobs=1,
    temperature 0. Prompts of 40 tokens span three chunks of 16."""
    base = tok.encode("The quick brown fox jumps over the lazy dog. " * 4)[:40]
    prompts = [base, base[:17], base[5:9]]
    out = ok(
        server,
        {
            "prompt": prompts,
            "max_tokens": 1,
            "logprobs": 1,
            "echo": True,
            "temperature": 0.0,
            "seed": 1234,
        },
    )
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    for c, ids in zip(out["choices"], prompts, strict=True):
        ref = hf(ids)
        generated = int(ref[-1].argmax())
        check_legacy(c["logprobs"], ids + [generated], ref, 1, tok)
        assert c["text"] == tok.decode(ids) + token_str(tok, generated)
        assert len(c["prompt_logprobs"]) == len(ids)  # vLLM sets both (echo)
    assert out["usage"]["prompt_tokens"] == sum(map(len, prompts))
    assert out["usage"]["completion_tokens"] == 3


def test_score_only_with_max_tokens_0(server, hf, tok):
    ids = tok.encode("Hello there, how are you doing today?")
    out = ok(server, {"prompt": ids, "max_tokens": 0, "logprobs": 3, "echo": True})
    (c,) = out["choices"]
    check_legacy(c["logprobs"], ids, hf(ids), 3, tok)
    assert c["text"] == tok.decode(ids) and c["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 0
    r = post(server, {"prompt": ids, "max_tokens": 0})  # without echo: nothing to return
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_string_prompt_echo_with_sampled_tokens(server, hf, tok):
    text = "Once upon a time"
    ids = tok.encode(text)
    out = ok(
        server,
        {
            "prompt": text,
            "max_tokens": 4,
            "logprobs": 2,
            "echo": True,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    (c,) = out["choices"]
    full = ids + c["token_ids"]
    check_legacy(c["logprobs"], full, hf(full), 2, tok)
    assert c["text"].startswith(text) and c["prompt_token_ids"] == ids


def test_prompt_logprobs_field(server, hf, tok):
    """vLLM's extra field without echo: per prompt token null, then {token id: {logprob,
    rank, decoded_token}} with the actual token and the top k."""
    ids = tok.encode("A short prompt to score")
    out = ok(server, {"prompt": ids, "max_tokens": 2, "prompt_logprobs": 2})
    (c,) = out["choices"]
    assert c["logprobs"] is None and c["text"]
    pl, ref = c["prompt_logprobs"], hf(ids)
    assert len(pl) == len(ids) and pl[0] is None
    for p in range(1, len(ids)):
        row, actual = ref[p - 1], ids[p]
        expect = {actual, *row.topk(2).indices.tolist()}
        assert {int(t) for t in pl[p]} == expect
        entry = pl[p][str(actual)]
        assert entry["logprob"] == pytest.approx(float(row[actual]), abs=1e-4)
        assert entry["rank"] == int((row >= row[actual]).sum())
        assert entry["decoded_token"] == token_str(tok, actual)
    plain = ok(server, {"prompt": ids, "max_tokens": 2})
    assert "prompt_logprobs" not in plain["choices"][0]


def test_streamed_echo_with_logprobs_equals_full(server, tok):
    ids = tok.encode("Streaming the prompt back with its logprobs")
    body = {
        "prompt": ids,
        "max_tokens": 3,
        "logprobs": 1,
        "echo": True,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    full = ok(server, body)["choices"][0]
    r = post(server, {**body, "stream": True})
    events = [e for e in parse_sse(r.text) if e != "[DONE]"]
    text, cols = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in events:
        for c in e["choices"]:
            text += c["text"]
            for k in cols:
                cols[k] += (c["logprobs"] or {}).get(k, [])
    assert text == full["text"]
    assert cols == full["logprobs"]
    assert events[0]["choices"][0]["text"] == tok.decode(ids)  # the prompt comes first


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"prompt_logprobs": MAX_LOGPROBS + 1}, "prompt_logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"echo": True, "logprobs": MAX_LOGPROBS + 1}, "logprobs"),
    ],
)
def test_bad_prompt_logprobs_are_400(server, body, param):
    r = post(server, {"prompt": "hi", "max_tokens": 1, **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"]


def test_chat_prompt_logprobs(server, hf, tok):
    """The chat route takes vLLM's field too: the response's top-level prompt_logprobs score
    the templated conversation's tokens."""
    messages = [{"role": "user", "content": "Score this conversation"}]
    out = ok(
        server,
        {"messages": messages, "max_tokens": 2, "prompt_logprobs": 1, "return_token_ids": True},
        "chat/completions",
    )
    ids, pl = out["prompt_token_ids"], out["prompt_logprobs"]
    ref = hf(ids)
    assert len(pl) == len(ids) and pl[0] is None
    for p in range(1, len(ids)):
        assert pl[p][str(ids[p])]["logprob"] == pytest.approx(float(ref[p - 1, ids[p]]), abs=1e-4)
    plain = ok(server, {"messages": messages, "max_tokens": 2}, "chat/completions")
    assert "prompt_logprobs" not in plain


def test_lm_eval_remote_tokenizer(server, tok):
    """lm-eval's tokenizer_backend=remote: /tokenizer_info, then /tokenize and /detokenize."""
    from lm_eval.utils import RemoteTokenizer

    remote = RemoteTokenizer(f"{server.base_url}/v1/completions")
    text = "Remote tokenizers tokenize as the server does"
    assert remote.encode(text) == tok.encode(text, add_special_tokens=False)
    assert remote.decode(tok.encode(text)) == text
    assert remote.eos_token == "</s>" and remote.eos_token_id == tok.eos_token_id


def test_n_choices_and_streamed_score_only(server, hf, tok):
    """n = 2 echoed choices share the prompt's columns; a streamed score-only request sends
    the prompt with its logprobs, then only finish_reason "length"."""
    ids = tok.encode("Two samples of one scored prompt")
    out = ok(
        server,
        {
            "prompt": ids,
            "max_tokens": 2,
            "n": 2,
            "logprobs": 1,
            "echo": True,
            "seed": 7,
            "ignore_eos": True,
        },
    )
    ref = hf(ids)
    for c in out["choices"]:
        lp = c["logprobs"]
        assert len(lp["tokens"]) == len(ids) + 2 and lp["token_logprobs"][0] is None
        for p in range(1, len(ids)):
            assert lp["token_logprobs"][p] == pytest.approx(float(ref[p - 1, ids[p]]), abs=1e-4)
    r = post(server, {"prompt": ids, "max_tokens": 0, "logprobs": 1, "echo": True, "stream": True})
    choices = [c for e in parse_sse(r.text) if e != "[DONE]" for c in e["choices"]]
    assert choices[0]["text"] == tok.decode(ids)
    assert choices[0]["logprobs"]["tokens"] == [token_str(tok, t) for t in ids]
    assert [c["text"] for c in choices[1:]] == [""] and choices[-1]["finish_reason"] == "length"
