"""`--reasoning-parser` end to end: a tiny random model whose tokenizer has `<think>` /
`</think>` tokens and whose chat template opens `<think>` (as DeepSeek-R1's does);
`thinking_token_budget` makes it close the thinking (the end token is forced), so
reasoning_content, content, usage and the grammar's start are all checked on real output."""

from __future__ import annotations

import copy
import json

import jsonschema
import openai
import pytest
from server_harness import TINY_SERVER_ARGS, start_server

from tests.conftest import TINY_VOCAB, make_tiny_checkpoint

R1_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if reasoning_effort is defined %}effort: {{ reasoning_effort }}\n{% endif %}"
    "<s>assistant:<think>\n"
)
# Qwen3 thinking-variant style: the template opens the thinking unless it is turned off, then
# it writes an empty thinking block.
QWEN3_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}<s>assistant:"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}"
)
MSGS = [{"role": "user", "content": "Is 7 prime?"}]
SCHEMA = {
    "type": "object",
    "properties": {"prime": {"type": "boolean"}, "why": {"enum": ["odd", "small"]}},
    "required": ["prime", "why"],
}


def _thinking_checkpoint(tmp_path_factory, tiny_tokenizer, template: str, name: str) -> str:
    tok = copy.deepcopy(tiny_tokenizer)
    tok.add_tokens(["<think>", "</think>"])  # ordinary added tokens, as R1's and Qwen3's
    tok.chat_template = template
    path = make_tiny_checkpoint(
        tmp_path_factory.mktemp(name), "llama", tok, seed=5, vocab_size=TINY_VOCAB + 2
    )
    return str(path)


def _client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def r1(tmp_path_factory, tiny_tokenizer):
    model = _thinking_checkpoint(tmp_path_factory, tiny_tokenizer, R1_TEMPLATE, "r1")
    srv = start_server(
        tmp_path_factory,
        model,
        [*TINY_SERVER_ARGS, "--reasoning-parser", "deepseek_r1", "--served-model-name", "r1"],
        name="r1",
    )
    yield _client(srv)
    srv.stop()


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, tiny_tokenizer):
    model = _thinking_checkpoint(tmp_path_factory, tiny_tokenizer, QWEN3_TEMPLATE, "qwen3t")
    srv = start_server(
        tmp_path_factory,
        model,
        [
            *TINY_SERVER_ARGS,
            "--reasoning-parser",
            "qwen3",
            "--served-model-name",
            "q",
            "--trust-request-chat-template",
        ],
        name="qwen3t",
    )
    yield _client(srv)
    srv.stop()


def _stream(client, **body) -> tuple[str, str, dict]:
    reasoning, content, usage = "", "", None
    for chunk in client.chat.completions.create(
        stream=True, stream_options={"include_usage": True}, **body
    ):
        usage = chunk.usage or usage
        for choice in chunk.choices:
            d = choice.delta.model_dump()
            assert d.get("reasoning") == d.get("reasoning_content")
            reasoning += d.get("reasoning_content") or ""
            content += d.get("content") or ""
    return reasoning, content, usage


@pytest.mark.parametrize("budget", [0, 6])
def test_budget_closes_the_thinking_and_splits_the_answer(r1, budget):
    body = dict(
        model="r1",
        messages=MSGS,
        max_tokens=20,
        temperature=1.0,
        seed=3,
        extra_body={"thinking_token_budget": budget},
    )
    out = r1.chat.completions.create(**body)
    msg = out.choices[0].message.model_dump()
    reasoning = msg.get("reasoning_content")
    assert reasoning == msg.get("reasoning")
    assert out.usage.completion_tokens_details.reasoning_tokens == budget
    assert "</think>" not in (msg["content"] or "") + (reasoning or "")
    assert bool(reasoning) == bool(budget)  # budget 0: the end is forced at once
    streamed, content, usage = _stream(r1, **body)
    assert streamed == (reasoning or "") and content == (msg["content"] or "")
    assert usage.completion_tokens_details.reasoning_tokens == budget


def test_unterminated_thinking_is_all_reasoning(r1):
    # a budget past max_tokens: the thinking never ends
    out = r1.chat.completions.create(
        model="r1",
        messages=MSGS,
        max_tokens=8,
        temperature=1.0,
        seed=4,
        extra_body={"thinking_token_budget": 50},
    )
    msg = out.choices[0].message
    assert msg.content is None and msg.reasoning_content
    assert out.usage.completion_tokens_details.reasoning_tokens == 8


def test_structured_output_applies_after_the_thinking(r1):
    for stream in (False, True):
        body = dict(
            model="r1",
            messages=MSGS,
            max_tokens=60,
            temperature=1.0,
            seed=7,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": SCHEMA, "strict": True},
            },
            extra_body={"thinking_token_budget": 5},
        )
        if stream:
            reasoning, content, usage = _stream(r1, **body)
        else:
            out = r1.chat.completions.create(**body)
            reasoning, content = (
                out.choices[0].message.reasoning_content,
                out.choices[0].message.content,
            )
            usage = out.usage
        # The thinking is free text (the tiny model's, not JSON); the answer is the schema's.
        assert usage.completion_tokens_details.reasoning_tokens == 5
        jsonschema.validate(json.loads(content), {**SCHEMA, "additionalProperties": False})
        with pytest.raises(ValueError):
            json.loads(reasoning)


def test_named_tool_call_after_the_thinking(r1):
    tool = {"type": "function", "function": {"name": "answer", "parameters": SCHEMA}}
    out = r1.chat.completions.create(
        model="r1",
        messages=MSGS,
        max_tokens=60,
        temperature=1.0,
        seed=2,
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "answer"}},
        extra_body={"thinking_token_budget": 4},
    )
    msg = out.choices[0].message
    assert msg.reasoning_content and out.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(msg.tool_calls[0].function.arguments), SCHEMA)


def test_reasoning_effort_reaches_the_template_and_bad_values_are_400(r1):
    out = r1.chat.completions.create(
        model="r1",
        messages=MSGS,
        max_tokens=1,
        reasoning_effort="high",
        extra_body={"return_token_ids": True},
    )
    prompt = (
        r1.completions.create(model="r1", prompt=[out.prompt_token_ids], max_tokens=1, echo=True)
        .choices[0]
        .text
    )
    assert "effort: high\n" in prompt
    with pytest.raises(openai.BadRequestError) as err:
        r1.chat.completions.create(model="r1", messages=MSGS, reasoning_effort="extreme")
    assert err.value.body["param"] == "reasoning_effort"
    with pytest.raises(openai.BadRequestError) as err:
        r1.chat.completions.create(
            model="r1", messages=MSGS, extra_body={"thinking_token_budget": -1}
        )
    assert err.value.body["param"] == "thinking_token_budget"


def test_include_reasoning_false_drops_the_text(r1):
    out = r1.chat.completions.create(
        model="r1",
        messages=MSGS,
        max_tokens=10,
        temperature=1.0,
        seed=3,
        extra_body={"thinking_token_budget": 3, "include_reasoning": False},
    )
    assert "reasoning_content" not in out.choices[0].message.model_dump(exclude_unset=True)
    assert out.usage.completion_tokens_details.reasoning_tokens == 3


def test_qwen3_enable_thinking_switch(qwen3):
    body = dict(model="q", messages=MSGS, max_tokens=12, temperature=1.0, seed=1)
    on = qwen3.chat.completions.create(**body, extra_body={"thinking_token_budget": 4})
    assert on.choices[0].message.reasoning_content
    assert on.usage.completion_tokens_details.reasoning_tokens == 4
    off = qwen3.chat.completions.create(
        **body,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}, "thinking_token_budget": 4},
    )
    msg = off.choices[0].message.model_dump()
    assert msg["content"] and "reasoning_content" not in msg
    assert off.usage.completion_tokens_details is None
    reasoning, content, _ = _stream(
        qwen3, **body, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    assert reasoning == "" and content


def test_openai_stream_helper_accumulates_reasoning_and_content(r1):
    # a schema ends the answer ("stop"): the helper refuses a length-cut completion
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
    body = dict(
        model="r1",
        messages=MSGS,
        max_tokens=60,
        temperature=1.0,
        seed=9,
        response_format=fmt,
        extra_body={"thinking_token_budget": 5},
    )
    whole = r1.chat.completions.create(**body).choices[0].message
    with r1.chat.completions.stream(**body) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "stop"
    assert final.message.content == whole.content
    assert final.message.model_dump().get("reasoning_content") == whole.reasoning_content


def test_n_choices_each_think_within_the_budget(r1):
    # n > 1 forks the request (and its thinking gate) after the prompt
    body = dict(
        model="r1",
        messages=MSGS,
        max_tokens=10,
        temperature=1.0,
        seed=11,
        n=2,
        extra_body={"thinking_token_budget": 3},
    )
    out = r1.chat.completions.create(**body)
    assert [bool(c.message.reasoning_content) for c in out.choices] == [True, True]
    assert out.usage.completion_tokens_details.reasoning_tokens == 6
    streamed = {}
    for chunk in r1.chat.completions.create(stream=True, **body):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + (
                c.delta.model_dump().get("reasoning_content") or ""
            )
    assert [streamed[i] for i in (0, 1)] == [c.message.reasoning_content for c in out.choices]


# Hybrid Qwen3's template: the prompt does not open the thinking, the model does (or not).
HYBRID_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}<s>assistant:"
)


def test_qwen3_model_opens_the_thinking_then_the_grammar_applies(qwen3):
    tok = {t: _token(qwen3, t) for t in ("<think>", "</think>")}
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
    body = dict(
        model="q",
        messages=MSGS,
        max_tokens=80,
        temperature=1.0,
        seed=4,
        response_format=fmt,
        extra_body={
            "chat_template": HYBRID_TEMPLATE,
            "thinking_token_budget": 3,
            # the model opens the thinking: <think> wins while it may come
            "logit_bias": {str(tok["<think>"]): 100},
        },
    )
    out = qwen3.chat.completions.create(**body)
    msg = out.choices[0].message
    assert out.usage.completion_tokens_details.reasoning_tokens == 3
    assert msg.reasoning_content == "<think>" * 3  # biased, then the budget forced </think>
    jsonschema.validate(json.loads(msg.content), SCHEMA)  # <think> is not JSON: masked after
    # without the bias the tiny model answers at once: the grammar holds from the first token
    body["extra_body"] = {"chat_template": HYBRID_TEMPLATE, "thinking_token_budget": 3}
    out = qwen3.chat.completions.create(**body)
    assert out.usage.completion_tokens_details.reasoning_tokens in (0, 3)
    jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)


def _token(client, text: str) -> int:
    import httpx

    base = str(client.base_url).removesuffix("/v1/")
    (tid,) = httpx.post(
        f"{base}/tokenize", json={"prompt": text, "add_special_tokens": False}
    ).json()["tokens"]
    return tid
