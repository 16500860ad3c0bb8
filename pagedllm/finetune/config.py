"""`FinetuneConfig`: one LoRA / QLoRA training run, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL_LINEAR = "all-linear"
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class FinetuneConfig:
    """What to train on, how, and where the adapter goes.

    The adapter's update is `(lora_alpha / lora_r) * B @ A` (`lora_alpha / sqrt(lora_r)` with
    `use_rslora`); `lora_alpha` is a scale, never a learning rate (that is `lr`).
    `target_modules` are PEFT names (`q_proj`, ..., matched as PEFT matches them) or
    "all-linear" (every linear layer except lm_head). `max_steps` (optimizer steps) overrides
    `epochs`. `dtype` is the autocast compute dtype: bfloat16 needs hardware with bf16,
    float16 runs with a loss scaler.
    """

    base: str | None
    data: Path
    out: Path
    eval_data: Path | None = None
    lora_r: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] | str = DEFAULT_TARGETS
    use_rslora: bool = False
    epochs: int = 1
    max_steps: int | None = None
    lr: float = 2e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_grad_norm: float | None = 1.0
    batch_size: int = 4
    grad_accum: int = 1
    max_seq_len: int = 512
    gradient_checkpointing: bool = False
    dtype: str = "float32"
    qlora: bool = False
    seed: int = 0
    shuffle: bool = True
    eval_every: int | None = None
    device: str = "cpu"
    progress: bool = True

    def __post_init__(self) -> None:
        def need(ok: bool, why: str) -> None:
            if not ok:
                raise ValueError(why)

        object.__setattr__(self, "data", Path(self.data))
        object.__setattr__(self, "out", Path(self.out))
        if self.eval_data is not None:
            object.__setattr__(self, "eval_data", Path(self.eval_data))
        tm = self.target_modules
        if isinstance(tm, str):
            names = tuple(t.strip() for t in tm.split(",") if t.strip())
            tm = ALL_LINEAR if names == (ALL_LINEAR,) else names
        else:
            tm = tuple(tm)
        object.__setattr__(self, "target_modules", tm)
        need(bool(tm), "target_modules must name at least one module (e.g. q_proj,v_proj "
             "or all-linear)")
        need(isinstance(tm, str) or ALL_LINEAR not in tm,
             f"{ALL_LINEAR} cannot be combined with other target_modules, got {list(tm)}")
        need(self.lora_r >= 1, f"lora_r must be >= 1 (usual ranks 8, 16, 32, 64), got "
             f"{self.lora_r}")
        need(self.lora_alpha > 0, f"lora_alpha must be > 0, got {self.lora_alpha}")
        need(0.0 <= self.lora_dropout < 1.0, f"lora_dropout must be in [0, 1), got "
             f"{self.lora_dropout}")
        need(0.0 < self.lr <= 1.0,
             f"lr must be in (0, 1], got {self.lr}" + (
                 "; it looks like a lora_alpha: alpha scales the update (alpha/r), the "
                 "learning rate is usually 1e-5 .. 1e-3" if self.lr > 1.0 else ""))
        need(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")
        need(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        need(self.max_grad_norm is None or self.max_grad_norm > 0,
             f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        need(self.epochs >= 1, f"epochs must be >= 1, got {self.epochs}")
        need(self.max_steps is None or self.max_steps >= 1,
             f"max_steps must be >= 1, got {self.max_steps}")
        need(self.batch_size >= 1, f"batch_size must be >= 1, got {self.batch_size}")
        need(self.grad_accum >= 1, f"grad_accum must be >= 1, got {self.grad_accum}")
        need(self.max_seq_len >= 2, f"max_seq_len must be >= 2, got {self.max_seq_len}")
        need(self.eval_every is None or self.eval_every >= 1,
             f"eval_every must be >= 1, got {self.eval_every}")
        need(self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got "
             f"{self.dtype!r}")
