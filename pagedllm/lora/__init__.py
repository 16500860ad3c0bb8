"""Multi-LoRA serving: PEFT adapters per request, several in one batch (see manager.py).

Names are imported on first use (PEP 562): `lora.request` (the CLI's --lora-modules) stays
free of torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "AdapterError": "pagedllm.lora.adapter",
    "LoRAAdapter": "pagedllm.lora.adapter",
    "LoRAConfig": "pagedllm.lora.config",
    "LoRARequest": "pagedllm.lora.request",
}
__all__ = ["AdapterError", "LoRAAdapter", "LoRAConfig", "LoRARequest"]

if TYPE_CHECKING:
    from pagedllm.lora.adapter import AdapterError, LoRAAdapter
    from pagedllm.lora.config import LoRAConfig
    from pagedllm.lora.request import LoRARequest


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pagedllm.lora' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value
