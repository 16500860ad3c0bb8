"""Fixtures of the fine-tuning tests: a learnable synthetic dataset and one 30-step run on
the tiny Llama shared by the tests that inspect its result."""

from __future__ import annotations

from pathlib import Path

import pytest
from finetune_data import pattern_rows, write_jsonl


@pytest.fixture(scope="session")
def pattern_data(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("ftdata") / "train.jsonl", pattern_rows())


@pytest.fixture(scope="session")
def ft_config(tiny_llama_dir, pattern_data, tmp_path_factory):
    """`ft_config(**overrides)`: a 30-step LoRA config on the tiny Llama."""
    from pagedllm.finetune import FinetuneConfig

    def make(**kw):
        base = dict(base=str(tiny_llama_dir), data=pattern_data, eval_data=pattern_data,
                    out=tmp_path_factory.mktemp("adapter"), max_steps=30, lr=1e-2,
                    batch_size=4, lora_r=4, lora_alpha=8.0, progress=False)
        base.update(kw)
        return FinetuneConfig(**base)
    return make


@pytest.fixture(scope="session")
def trained(ft_config):
    """(trainer, result, base weights before training) of a 30-step run on all linears with
    rsLoRA (scale alpha/sqrt(r) = 4, not alpha/r = 2)."""
    import torch

    from pagedllm.finetune import Trainer

    trainer = Trainer(ft_config(target_modules="all-linear", use_rslora=True))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()
              if "lora_" not in n}
    with torch.random.fork_rng():
        result = trainer.train()
    return trainer, result, before
