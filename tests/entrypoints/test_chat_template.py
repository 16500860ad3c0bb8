"""A model without a chat template: chat answers 400 saying how to pass one; --chat-template
(a file, or inline Jinja) supplies it, for the server and offline."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest
from server_harness import TINY_SERVER_ARGS, start_server

from pagedllm import SamplingParams
from pagedllm.engine.chat_template import MissingChatTemplateError, resolve_chat_template

TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory, tiny_llama_dir):
    """The tiny Llama with its chat template removed (like a base model)."""
    path = tmp_path_factory.mktemp("base") / "model"
    shutil.copytree(tiny_llama_dir, path)
    (path / "chat_template.jinja").unlink(missing_ok=True)
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg_path.write_text(json.dumps(cfg))
    return path


def test_resolve_file_inline_and_bad_value(tmp_path) -> None:
    f = tmp_path / "t.jinja"
    f.write_text(TEMPLATE)
    assert resolve_chat_template(str(f)) == TEMPLATE
    assert resolve_chat_template(TEMPLATE) == TEMPLATE
    with pytest.raises(ValueError, match="neither a readable file"):
        resolve_chat_template(str(tmp_path / "missing.jinja"))


def test_offline_chat(base_model_dir, make_llm, tmp_path) -> None:
    llm = make_llm(base_model_dir)
    with pytest.raises(MissingChatTemplateError, match="--chat-template"):
        llm.chat(MESSAGES, use_tqdm=False)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    inline = llm.chat(MESSAGES, params, chat_template=TEMPLATE, use_tqdm=False)
    expected = llm.get_tokenizer().encode("[user] hello there\n", add_special_tokens=False)
    assert inline[0].prompt_token_ids == expected
    f = tmp_path / "t.jinja"
    f.write_text(TEMPLATE)
    engine_wide = make_llm(base_model_dir, chat_template=str(f))
    assert engine_wide.chat(MESSAGES, params, use_tqdm=False)[0].prompt_token_ids == expected


def test_server_without_and_with_chat_template(base_model_dir, tmp_path_factory,
                                               tmp_path) -> None:
    body = {"model": str(base_model_dir), "messages": MESSAGES, "max_tokens": 2}
    with start_server(tmp_path_factory, str(base_model_dir), TINY_SERVER_ARGS) as srv:
        r = httpx.post(f"{srv.base_url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400
        err = r.json()["error"]
        assert "--chat-template" in err["message"] and err["param"] == "messages"
        # The server keeps serving completions.
        r = httpx.post(f"{srv.base_url}/v1/completions", timeout=30, json={
            "model": str(base_model_dir), "prompt": "hello", "max_tokens": 2})
        assert r.status_code == 200
    f = tmp_path / "t.jinja"
    f.write_text(TEMPLATE)
    args = [*TINY_SERVER_ARGS, "--chat-template", str(f)]
    with start_server(tmp_path_factory, str(base_model_dir), args, name="templated") as srv:
        r = httpx.post(f"{srv.base_url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        r = httpx.post(f"{srv.base_url}/tokenize", timeout=30,
                       json={"model": str(base_model_dir), "messages": MESSAGES})
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(base_model_dir)
        assert r.json()["tokens"] == tok.encode("[user] hello there\n",
                                                add_special_tokens=False)
