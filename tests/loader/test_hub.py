"""Models by Hub name from a fake HF cache (models--org--name/snapshots/<rev>/), offline."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pagedllm import SamplingParams
from pagedllm.loader import ModelNotFoundError, resolve_model
from pagedllm.loader.hub import looks_like_repo_id

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
PROMPT = {"prompt_token_ids": [5, 17, 99, 230, 7]}


def fake_cache(hub: Path, repo_id: str, source: Path, commit: str = COMMIT,
               ref: str = "main") -> Path:
    """Lay out `source`'s files as huggingface_hub stores a downloaded snapshot."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(source, snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def offline(monkeypatch, tmp_path) -> Path:
    """An empty HF cache under HF_HOME with downloads disabled."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return tmp_path / "hf-home" / "hub"


def test_repo_id_shapes() -> None:
    assert looks_like_repo_id("Org/Model-1.5B")
    assert looks_like_repo_id("gpt2")
    for path in ("./x", "/abs/dir", "a/b/c", "~/m", "model.gguf", "Org/m.GGUF"):
        assert not looks_like_repo_id(path), path


def test_llm_by_name_matches_local_dir(offline, tiny_llama_dir, make_llm) -> None:
    snapshot = fake_cache(offline, "tiny-org/tiny-llama", tiny_llama_dir)
    assert resolve_model("tiny-org/tiny-llama") == snapshot
    by_name = make_llm("tiny-org/tiny-llama").generate(PROMPT, GREEDY, use_tqdm=False)
    local = make_llm(tiny_llama_dir).generate(PROMPT, GREEDY, use_tqdm=False)
    assert by_name[0].outputs[0].token_ids == local[0].outputs[0].token_ids


def test_hf_hub_cache_revision_and_download_dir(offline, monkeypatch, tmp_path,
                                                tiny_llama_dir, tiny_qwen2_dir) -> None:
    hub = tmp_path / "hub-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))      # wins over HF_HOME
    main = fake_cache(hub, "org/m", tiny_llama_dir)
    tagged = fake_cache(hub, "org/m", tiny_qwen2_dir, commit=OTHER, ref="v2")
    assert resolve_model("org/m") == main
    assert resolve_model("org/m", revision="v2") == tagged
    assert resolve_model("org/m", revision=OTHER) == tagged
    elsewhere = tmp_path / "downloads"
    only_here = fake_cache(elsewhere, "org/other", tiny_qwen2_dir)
    assert resolve_model("org/other", download_dir=elsewhere) == only_here
    with pytest.raises(ModelNotFoundError, match="org/other"):
        resolve_model("org/other")


def test_tokenizer_by_name(offline, tiny_llama_dir, tmp_path, tiny_tokenizer,
                           make_llm) -> None:
    tok_dir = tmp_path / "tok"
    tiny_tokenizer.save_pretrained(tok_dir)
    (tok_dir / "config.json").write_text("{}")
    fake_cache(offline, "org/tok", tok_dir)
    llm = make_llm(tiny_llama_dir, tokenizer="org/tok")
    assert llm.get_tokenizer().encode("hello world") == tiny_tokenizer.encode("hello world")


def test_offline_not_cached_is_one_clear_line(offline) -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model("nobody/nothing", revision="v1")
    msg = str(err.value)
    assert "'nobody/nothing'" in msg and "revision v1" in msg
    assert str(offline / "models--nobody--nothing") in msg and "HF_HUB_OFFLINE=1" in msg


def test_cli_offline_not_cached_no_traceback(offline) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pagedllm.entrypoints.cli", "generate", "nobody/nothing",
         "--prompt", "hi"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "nobody/nothing" in errors[0], proc.stderr
