"""Draft models for the tiny Llama: one close to it (the target with jittered norms, so
most greedy drafts are accepted and some are not) and an unrelated one (mostly rejected)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import make_tiny_checkpoint


@pytest.fixture(scope="session")
def close_draft_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("draft_close"), "llama",
                                tiny_tokenizer, seed=0, norm_jitter=0.15)


@pytest.fixture(scope="session")
def other_draft_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("draft_other"), "llama",
                                tiny_tokenizer, seed=11, num_hidden_layers=1, hidden_size=32,
                                intermediate_size=64)
