"""LoRA / QLoRA fine-tuning on the serving model's own layers (`pagedllm finetune`); the
adapter it writes is PEFT-format and served unchanged by `serve --lora-modules`."""

from pagedllm.finetune.config import FinetuneConfig
from pagedllm.finetune.trainer import (
    FinetuneResult,
    FrozenBaseError,
    NonFiniteLossError,
    Trainer,
    finetune,
)

__all__ = ["FinetuneConfig", "FinetuneResult", "FrozenBaseError", "NonFiniteLossError",
           "Trainer", "finetune"]
