"""LoRA / QLoRA fine-tuning on the serving model's own layers (`pagedllm finetune`); the
adapter it writes is PEFT-format and served unchanged by `serve --lora-modules`.

Names are imported on first use (PEP 562): the CLI builds `finetune`'s flags from
`finetune.cli` without importing torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedllm.lazy_exports import lazy_getattr

_EXPORTS = {
    "FinetuneConfig": "pagedllm.finetune.config",
    "FinetuneResult": "pagedllm.finetune.trainer",
    "FrozenBaseError": "pagedllm.finetune.trainer",
    "NonFiniteLossError": "pagedllm.finetune.trainer",
    "Trainer": "pagedllm.finetune.trainer",
    "finetune": "pagedllm.finetune.trainer",
}
__all__ = [
    "FinetuneConfig",
    "FinetuneResult",
    "FrozenBaseError",
    "NonFiniteLossError",
    "Trainer",
    "finetune",
]

if TYPE_CHECKING:
    from pagedllm.finetune.config import FinetuneConfig
    from pagedllm.finetune.trainer import (
        FinetuneResult,
        FrozenBaseError,
        NonFiniteLossError,
        Trainer,
        finetune,
    )


__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
