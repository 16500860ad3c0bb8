"""`--tool-call-parser qwen3_coder` through a real server: the tiny model is scripted (a
regex) to write Qwen3-Coder's XML calls; the openai client gets typed arguments, streamed and
not, and the flag refuses names outside the registry."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import openai
import pytest
from server_harness import TINY_SERVER_ARGS, start_server

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
            },
        },
    }
]
XML = (
    "On it.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)


@pytest.fixture(scope="module")
def client(tmp_path_factory, tiny_model_path):
    srv = start_server(
        tmp_path_factory,
        tiny_model_path,
        [*TINY_SERVER_ARGS, "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"],
        name="qwen3_coder",
    )
    yield openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0)
    srv.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_qwen3_coder_calls_reach_the_client_typed(client, stream):
    body = dict(
        model=client.models.list().data[0].id,
        max_tokens=300,
        seed=1,
        tools=TOOLS,
        messages=[{"role": "user", "content": "Weather?"}],
        extra_body={"structured_outputs": {"regex": re.escape(XML)}},
    )
    if stream:
        with client.chat.completions.stream(**body) as s:
            deltas = [e.delta for e in s if e.type == "content.delta"]
            final = s.get_final_completion()
        assert "".join(deltas) == "On it.\n"
    else:
        final = client.chat.completions.create(**body)
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content.strip() == "On it."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}


def test_unknown_parser_name_is_refused_at_start():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pagedllm.entrypoints.cli",
            "serve",
            "m",
            "--tool-call-parser",
            "nope",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "invalid choice: 'nope'" in out.stderr
    assert "qwen3_coder" in out.stderr
