from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def llm(tiny_llama_dir, make_llm):
    return make_llm(tiny_llama_dir, max_num_seqs=128)
