"""Gradient checkpointing per decoder layer: the same gradients (within 1e-6 relative) and
fewer bytes held for backward (measured with saved-tensor hooks)."""

from __future__ import annotations

import torch

from pagedllm.finetune import Trainer
from pagedllm.finetune.data import collate
from pagedllm.finetune.memory import SavedActivationMeter


def _grads_and_saved(cfg) -> tuple[dict[str, torch.Tensor], int]:
    trainer = Trainer(cfg)
    for m, _ in trainer.lora.values():  # B != 0 so every A gets a gradient too
        for b in m.lora_B:
            b.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    batch = collate(trainer.train_data[:4])
    trainer.model.train()
    with SavedActivationMeter(exclude=trainer.base_params) as meter:
        loss = trainer.loss_sum(batch) / batch.num_targets
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if "lora_" in n}
    assert all(p.grad is None for p in trainer.base_params)
    return grads, meter.bytes


def test_same_gradients_less_memory(ft_config) -> None:
    plain, plain_bytes = _grads_and_saved(ft_config(target_modules="all-linear"))
    ckpt, ckpt_bytes = _grads_and_saved(ft_config(target_modules="all-linear",
                                                  gradient_checkpointing=True))
    assert plain.keys() == ckpt.keys() and len(plain) == 2 * 7 * 2
    for name, g in plain.items():
        assert g.abs().max() > 0, name
        rel = (ckpt[name] - g).norm() / g.norm()
        assert rel <= 1e-6, (name, float(rel))
    assert ckpt_bytes < 0.5 * plain_bytes, (ckpt_bytes, plain_bytes)
