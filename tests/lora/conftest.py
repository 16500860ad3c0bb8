"""Fixtures of the LoRA tests: adapters made with peft for the tiny Llama and Qwen2."""

from __future__ import annotations

import pytest
from lora_adapters import ALL_LINEARS, QV, make_peft_adapter, peft_model

# name -> (arch, rank, targets, rslora)
ADAPTERS = {
    "llama_r4_qv": ("llama", 4, QV, False),
    "llama_r8_all_rs": ("llama", 8, ALL_LINEARS, True),
    "llama_r16_all": ("llama", 16, ALL_LINEARS, False),
    "qwen2_r16_all_rs": ("qwen2", 16, ALL_LINEARS, True),
    "qwen2_r8_qv": ("qwen2", 8, QV, False),
}


@pytest.fixture(scope="session")
def adapters(tmp_path_factory, tiny_llama_dir, tiny_qwen2_dir, hf_reference):
    """name -> adapter dir; each is registered with hf_reference as base + peft adapter."""
    bases = {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}
    out = {}
    for i, (name, (arch, r, targets, rslora)) in enumerate(ADAPTERS.items()):
        path = make_peft_adapter(bases[arch], tmp_path_factory.mktemp(name), r=r,
                                 targets=targets, rslora=rslora, seed=i)
        hf_reference.register(path, peft_model(bases[arch], path))
        out[name] = path
    return out
