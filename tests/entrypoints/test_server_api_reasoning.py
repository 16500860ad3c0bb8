"""Reasoning (--reasoning-parser) through the Anthropic Messages and OpenAI Responses APIs: a
tiny random model whose chat template opens `<think>` (as DeepSeek-R1's does), its thinking
closed by a budget. The thinking comes out as Anthropic `thinking` blocks and Responses
`reasoning` items, streamed and not, with the same text the chat route gives as
reasoning_content."""

from __future__ import annotations

import copy
import json

import anthropic
import httpx
import openai
import pytest
from server_harness import TINY_SERVER_ARGS, start_server

from tests.conftest import TINY_VOCAB, make_tiny_checkpoint

R1_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if reasoning_effort is defined %}effort: {{ reasoning_effort }}\n{% endif %}"
    "<s>assistant:<think>\n"
)
USER = [{"role": "user", "content": "Is 7 prime?"}]
GREEDY = {"temperature": 0}
BUDGET = 6


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = R1_TEMPLATE
    path = make_tiny_checkpoint(
        tmp_path_factory.mktemp("r1api"), "llama", tok, seed=5, vocab_size=TINY_VOCAB + 2
    )
    srv = start_server(
        tmp_path_factory,
        str(path),
        [*TINY_SERVER_ARGS, "--reasoning-parser", "deepseek_r1", "--served-model-name", "r1"],
        name="r1api",
    )
    yield srv
    srv.stop()


def _chat(server, **body) -> dict:
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _greedy_chat(server, max_tokens: int, **extra) -> dict:
    return _chat(
        server,
        model="r1",
        messages=USER,
        max_tokens=max_tokens,
        **GREEDY,
        thinking_token_budget=BUDGET,
        **extra,
    )


# ------------------------------------------------------------------ Anthropic
@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


def test_thinking_blocks(server, claude):
    chat = _greedy_chat(server, 20)["choices"][0]["message"]
    kw = dict(
        model="r1",
        max_tokens=20,
        messages=USER,
        extra_body=GREEDY,
        thinking={"type": "enabled", "budget_tokens": BUDGET},
    )
    msg = claude.messages.create(**kw)
    thinking, text = msg.content[0], msg.content[1]
    assert thinking.type == "thinking" and thinking.thinking == chat["reasoning_content"]
    assert text.type == "text" and text.text == chat["content"]
    with claude.messages.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert "".join(e.thinking for e in events if e.type == "thinking") == thinking.thinking
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[1].text == text.text
    # display "omitted": no thinking blocks (the thinking still happened: same answer)
    omitted = claude.messages.create(
        **{**kw, "thinking": {"type": "enabled", "budget_tokens": BUDGET, "display": "omitted"}}
    )
    assert [b.type for b in omitted.content] == ["text"]
    assert omitted.content[0].text == text.text


def test_effort_reaches_the_template(claude):
    plain = claude.messages.count_tokens(model="r1", messages=USER)
    high = claude.messages.count_tokens(model="r1", messages=USER, output_config={"effort": "high"})
    assert high.input_tokens > plain.input_tokens
    msg = claude.messages.create(
        model="r1", max_tokens=1, messages=USER, output_config={"effort": "high"}
    )
    assert msg.usage.input_tokens == high.input_tokens
    with pytest.raises(anthropic.BadRequestError):  # the chat route knows no "max" effort
        claude.messages.create(
            model="r1", max_tokens=1, messages=USER, output_config={"effort": "max"}
        )


# ------------------------------------------------------------------ Responses
@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_reasoning_items(server, client):
    chat = _greedy_chat(server, 20)
    kw = dict(
        model="r1",
        input=USER,
        max_output_tokens=20,
        **GREEDY,
        extra_body={"thinking_token_budget": BUDGET},
    )
    resp = client.responses.create(**kw)
    reasoning, message = resp.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert reasoning.content[0].text == chat["choices"][0]["message"]["reasoning_content"]
    assert resp.output_text == chat["choices"][0]["message"]["content"]
    assert resp.usage.output_tokens_details.reasoning_tokens == BUDGET
    with client.responses.stream(**kw) as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == reasoning.content[0].text
    assert [i.type for i in final.output] == ["reasoning", "message"]
    assert final.output_text == resp.output_text
    # The next turn leaves the reasoning out of the prompt, as the chat template does.
    nxt = client.responses.create(
        model="r1", input="And 9?", previous_response_id=resp.id, max_output_tokens=1
    )
    prompt = _chat(
        server,
        model="r1",
        max_tokens=1,
        messages=[
            *USER,
            {"role": "assistant", "content": resp.output_text},
            {"role": "user", "content": "And 9?"},
        ],
    )["usage"]["prompt_tokens"]
    assert nxt.usage.input_tokens == prompt


def test_reasoning_effort_and_summary(client):
    plain = client.responses.create(model="r1", input=USER, max_output_tokens=1)
    high = client.responses.create(
        model="r1", input=USER, max_output_tokens=1, reasoning={"effort": "high"}
    )
    assert high.usage.input_tokens > plain.usage.input_tokens
    assert high.reasoning.effort == "high"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="r1", input=USER, reasoning={"summary": "auto"})
    assert err.value.body["param"] == "reasoning"
    assert json.dumps(err.value.body)
