"""Multi-LoRA serving: PEFT adapters per request, several in one batch (see manager.py).

Names are imported on first use (PEP 562): `lora.request` (the CLI's --lora-modules) stays
free of torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedllm.lazy_exports import lazy_getattr

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


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
