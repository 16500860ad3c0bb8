"""GET /tokenizer_info (vLLM's, behind --enable-tokenizer-info-endpoint): in-process app on a
tiny random Llama; the body lm-eval's remote tokenizer reads (special tokens, chat template),
no server paths, and a 404 in the OpenAI error shape without the flag."""

from __future__ import annotations

import argparse
import json

import pytest
from fastapi.testclient import TestClient

from pagedllm.engine.async_engine import AsyncEngine
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.entrypoints.api_server import build_app
from pagedllm.entrypoints.server_options import ServerOptions, add_server_option_args


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    engine = AsyncEngine(
        LLMEngine.from_engine_args(model=tiny_model_path, num_threads=1, kv_cache_memory="4MiB")
    )
    yield engine
    engine.engine.shutdown()


def test_flag_sets_the_option():
    parser = argparse.ArgumentParser()
    add_server_option_args(parser.add_argument_group("server"))
    assert not ServerOptions.from_args(parser.parse_args([])).enable_tokenizer_info_endpoint
    args = parser.parse_args(["--enable-tokenizer-info-endpoint"])
    assert ServerOptions.from_args(args).enable_tokenizer_info_endpoint


def test_tokenizer_info(engine, tiny_tokenizer, tiny_model_path):
    app = build_app(engine, options=ServerOptions(enable_tokenizer_info_endpoint=True))
    r = TestClient(app).get("/tokenizer_info")
    assert r.status_code == 200, r.text
    info = r.json()
    assert info["tokenizer_class"] == type(engine.engine.tokenizer).__name__
    assert info["bos_token"] == "<s>" and info["eos_token"] == "</s>"
    assert info["chat_template"] == tiny_tokenizer.chat_template
    assert tiny_model_path not in json.dumps(info)  # no paths on the server's disk
    assert not any(k.endswith("_file") or k == "name_or_path" for k in info)


def test_tokenizer_info_is_404_without_the_flag(engine):
    r = TestClient(build_app(engine)).get("/tokenizer_info")
    assert r.status_code == 404
    assert r.json()["error"]["message"]
