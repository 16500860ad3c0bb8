"""Units of issue #28's request checks, no server: the byte-length token bound never refuses
a prompt that fits (it is a true lower bound on the token count), chat_template_kwargs that
would reach the tokenizer are refused, and the JSON depth / lone-surrogate walk."""

from __future__ import annotations

import asyncio
import random

import pytest

from pagedllm.entrypoints.errors import APIError
from pagedllm.entrypoints.json_hygiene import BadRequestBody, check_json_tree
from pagedllm.entrypoints.prompt_inputs import PromptInputs, TokenBound


def _texts(rng: random.Random, vocab: list[str]) -> list[str]:
    alphabet = "abcdefghij klmnop \n\t=-_.,;:!?()[]{}<>'\"0123456789éüß中文日本語🙂🚀"
    out = []
    for _ in range(300):
        kind = rng.random()
        if kind < 0.4:  # runs of the vocabulary's own (longest) pieces: the worst case
            out.append("".join(rng.choice(vocab) for _ in range(rng.randrange(1, 60))))
        elif kind < 0.7:
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 400))))
        else:
            out.append(rng.choice(["=", " ", "a", "\n", "🙂"]) * rng.randrange(1, 2000))
    return out


def test_byte_bound_is_a_lower_bound_on_tokens(tiny_tokenizer):
    bound = TokenBound.of(tiny_tokenizer)
    longest = sorted((tiny_tokenizer.decode([i]) for i in range(len(tiny_tokenizer))),
                     key=len)[-50:]
    for text in _texts(random.Random(0), longest):
        n = len(tiny_tokenizer.encode(text, add_special_tokens=False))
        assert bound.min_tokens(len(text.encode("utf-8"))) <= n, (text[:80], n)


def test_prompt_over_the_bound_is_refused_before_tokenizing(tiny_tokenizer):
    inputs = PromptInputs(tiny_tokenizer, max_model_len=64)
    too_long = "x" * (64 * inputs.bound.max_token_bytes + 1)
    with pytest.raises(APIError) as exc:
        asyncio.run(inputs.encode(too_long))
    assert exc.value.code == "context_length_exceeded" and "bytes" in exc.value.message
    fits = "x" * (64 * inputs.bound.max_token_bytes)  # may still be too long: not refused
    assert asyncio.run(inputs.encode(fits))


@pytest.mark.parametrize("kwargs", [{"tokenizer_kwargs": {}}, {"padding": True},
                                    {"tokenize": False}, {"max_length": 5},
                                    {"return_tensors": "pt"}, {"_private": 1}])
def test_template_kwargs_that_reach_the_tokenizer_are_refused(tiny_tokenizer, kwargs):
    inputs = PromptInputs(tiny_tokenizer, max_model_len=64)
    conv = [{"role": "user", "content": "hi"}]
    with pytest.raises(APIError) as exc:
        asyncio.run(inputs.chat(conv, True, chat_template_kwargs=kwargs))
    assert exc.value.param == "chat_template_kwargs" and next(iter(kwargs)) in exc.value.message
    assert asyncio.run(inputs.chat(conv, True, chat_template_kwargs={"enable_thinking": 1}))


def test_request_template_refused_without_a_sandbox(tiny_tokenizer):
    inputs = PromptInputs(tiny_tokenizer, max_model_len=64)
    with pytest.raises(APIError) as exc:
        asyncio.run(inputs.chat([{"role": "user", "content": "hi"}], True,
                                chat_template="{{ 'x' }}"))
    assert exc.value.param == "chat_template"
    assert "--trust-request-chat-template" in exc.value.message


def test_json_tree_checks():
    deep: object = "leaf"
    for _ in range(5000):  # far past Python's recursion limit: the walk is iterative
        deep = [deep]
    with pytest.raises(BadRequestBody, match="deeper than 64"):
        check_json_tree({"a": deep})
    check_json_tree({"a": [[[{"b": "ok 🙂"}]]]})
    with pytest.raises(BadRequestBody) as exc:
        check_json_tree({"messages": [{"content": "x\ud800"}]})
    assert exc.value.path == "messages[0].content"
    with pytest.raises(BadRequestBody):
        check_json_tree({"\udfff": 1})
