"""`pagedllm generate --lora ADAPTER_DIR`: the adapter applies to every prompt (the same tokens
as the offline API with that adapter, which test_lora_vs_peft checks against peft), and a bad
adapter path is one clear line."""

from __future__ import annotations

import json

import pytest

from pagedllm import LoRARequest, SamplingParams
from pagedllm.entrypoints.cli import main

ENGINE = ["--kv-cache-memory", "4MiB", "--num-threads", "1"]
PROMPTS = ["hello world", "the end"]


def _generate(model_dir, capsys, *extra) -> list[list[int]]:
    argv = ["generate", str(model_dir), *ENGINE, "--max-tokens", "8", "--json", *extra]
    for p in PROMPTS:
        argv += ["--prompt", p]
    assert main(argv) == 0
    return [json.loads(line)["token_ids"] for line in capsys.readouterr().out.splitlines()]


def test_generate_with_lora_matches_offline_api(tiny_llama_dir, adapters, make_llm, capsys):
    path = adapters["llama_r16_all"]
    got = _generate(tiny_llama_dir, capsys, "--lora", str(path))
    llm = make_llm(tiny_llama_dir, enable_lora=True, max_lora_rank=16)
    want = [list(o.outputs[0].token_ids) for o in llm.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False,
        lora_request=LoRARequest("a", 1, str(path)))]
    assert got == want
    assert got != _generate(tiny_llama_dir, capsys)  # the adapter changed the output


def test_generate_with_bad_lora_is_one_line(tiny_llama_dir, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["generate", str(tiny_llama_dir), *ENGINE, "--lora", str(tmp_path / "nope"),
              "--prompt", "hi"])
    msg = str(exc.value)
    assert msg.startswith("pagedllm generate: error: ") and "not a PEFT adapter directory" in msg
    assert "\n" not in msg
