"""Fixtures of the server tests (helpers live in server_harness.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tiny_llama_dir) -> str:
    return str(tiny_llama_dir)
