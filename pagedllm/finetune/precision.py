"""Mixed precision done right: bf16 autocast only on hardware with bf16, fp16 only with a
loss scaler, fp32 otherwise. LoRA weights and the optimizer state stay fp32."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


def has_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def has_fp16(device: torch.device) -> bool:
    if device.type == "cuda":
        return True
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_fp16_supported())
    return False


@dataclass
class Precision:
    """The autocast dtype (None = fp32) and the loss scaler fp16 needs."""

    dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None
    device: torch.device

    @classmethod
    def for_run(cls, name: str, device: torch.device) -> Precision:
        if name == "float32":
            return cls(None, None, device)
        if name == "bfloat16":
            if not has_bf16(device):
                raise ValueError(f"dtype bfloat16: this {device.type} has no bf16 support "
                                 "(e.g. avx512_bf16 / AMX on CPU, Ampere+ on CUDA); use "
                                 "--dtype float32")
            return cls(torch.bfloat16, None, device)
        if not has_fp16(device):
            raise ValueError(f"dtype float16: this {device.type} has no fp16 compute; use "
                             "--dtype float32 (or bfloat16 where the hardware has it)")
        return cls(torch.float16, torch.amp.GradScaler(device.type), device)

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)
