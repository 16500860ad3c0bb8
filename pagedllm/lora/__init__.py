"""Multi-LoRA serving: PEFT adapters per request, several in one batch (see manager.py)."""

from pagedllm.lora.adapter import AdapterError, LoRAAdapter
from pagedllm.lora.config import LoRAConfig
from pagedllm.lora.request import LoRARequest

__all__ = ["AdapterError", "LoRAAdapter", "LoRAConfig", "LoRARequest"]
