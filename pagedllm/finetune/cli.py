"""`pagedllm finetune BASE --data train.jsonl --out ADAPTER_DIR`: flags -> FinetuneConfig."""

from __future__ import annotations

import argparse
import sys

from pagedllm.finetune.config import DEFAULT_TARGETS, DTYPES, FinetuneConfig


def add_finetune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", nargs="?", default=None,
                   help="base model: HF directory, .gguf file or Hub name (default: SmolLM2)")
    p.add_argument("--data", required=True, help="training JSONL (messages | prompt+"
                   "completion | text per line)")
    p.add_argument("--eval", dest="eval_data", default=None, help="evaluation JSONL")
    p.add_argument("--out", required=True, help="adapter directory to write (PEFT format)")
    p.add_argument("--lora-r", type=int, default=8, help="LoRA rank")
    p.add_argument("--lora-alpha", type=float, default=16.0,
                   help="scale numerator: update = alpha/r * B@A (not a learning rate)")
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument("--target-modules", default=",".join(DEFAULT_TARGETS),
                   help="comma-separated PEFT module names, or all-linear")
    p.add_argument("--use-rslora", action="store_true", help="scale alpha/sqrt(r)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=None, help="optimizer steps (overrides "
                   "--epochs)")
    p.add_argument("--lr", type=float, default=2e-4, help="AdamW learning rate")
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step")
    p.add_argument("--max-seq-len", type=int, default=512)
    p.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute each decoder layer in backward (less memory)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="autocast dtype (bfloat16 needs bf16 hardware; float16 uses a loss "
                   "scaler)")
    p.add_argument("--qlora", action="store_true",
                   help="keep the frozen base in NF4 (double-quantized scales)")
    p.add_argument("--eval-every", type=int, default=None, help="evaluate every N steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar")


def run_finetune(args) -> int:
    from pagedllm.finetune.trainer import finetune

    fields = {k: getattr(args, k) for k in FinetuneConfig.__dataclass_fields__
              if hasattr(args, k)}
    try:
        result = finetune(FinetuneConfig(**fields))
    except ValueError as e:
        sys.stderr.write(f"pagedllm finetune: error: {e}\n")
        return 2
    ev = (f"; eval loss {result.eval_before:.4f} -> {result.eval_after:.4f}"
          if result.eval_before is not None else "")
    sys.stdout.write(f"adapter written to {result.out} ({result.steps} steps, loss "
                     f"{result.losses[0]:.4f} -> {result.losses[-1]:.4f}{ev}; base weights "
                     f"{result.base_weight_bytes / 2**20:.1f} MiB, "
                     f"{result.tokens_per_s:.0f} tokens/s); serve it with "
                     f"--enable-lora --lora-modules NAME={result.out}\n")
    return 0
