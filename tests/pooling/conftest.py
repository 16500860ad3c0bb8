"""Pooling fixtures: tiny random sequence-classification checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
from hf_pooling import make_seq_cls_checkpoint


@pytest.fixture(scope="session")
def tiny_scorer_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A cross-encoder: one label (its sigmoid is the relevance score)."""
    return make_seq_cls_checkpoint(tmp_path_factory.mktemp("llama_scorer"), tiny_tokenizer, 1)


@pytest.fixture(scope="session")
def tiny_classifier_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """Three labels (softmax probabilities)."""
    return make_seq_cls_checkpoint(tmp_path_factory.mktemp("llama_cls3"), tiny_tokenizer, 3, seed=6)
