"""The engine's dtypes: what `--dtype` asks for, and what the weights and activations become.

    --dtype     device  activations, norms, attention,   linear weights (lm_head included)
                        KV cache ("auto")                 and the embedding table
    auto        CUDA    bf16 (fp16 without bf16)          the same
    auto        CPU     float32                           bf16 where `auto_linear_dtype` says
                                                          so (below), else float32
    bfloat16    CPU     float32                           bf16 (model/layers/quant/bf16.py)
    other       any     that dtype                        the same

On CPU, bf16 is a weight format, not a compute dtype: the fp32 kernels (attention, norms, the
C++ decode loop) keep running, and the linear layers read half the bytes
(model/layers/quant/bf16.py has the kernel contract).

`auto` on CPU picks bf16 linear weights when all of these hold (`auto_linear_dtype`):
  * the CPU has bf16 matrix instructions (amx_bf16 or avx512_bf16; kernels/cpu_features.py):
    there torch's bf16 matmul runs prefill 3.5-4.4x faster than fp32, on AVX2-only CPUs it is
    emulated and slower;
  * the weights are float once loaded: not a GGUF kept quantized, not AWQ / GPTQ / int8;
  * the checkpoint is not saved in float16: vLLM's `auto` downcasts float32 checkpoints and
    keeps a float16 one in float16, which this engine has no CPU kernels for; bf16 would
    round away 3 of the mantissa bits it was saved with, so it stays exact in float32;
  * `PAGEDLLM_AUTO_DTYPE` does not pin it (float32 or bfloat16; the test suite pins float32
    so its fp32-vs-HF comparisons at 1e-4 test fp32 on every CPU).
Greedy agreement with HF fp32 by vLLM's logprob rule is tested on SmolLM2 and Gemma 3 270M
(tests/model/quant/test_bf16_engine.py); no model family needed a deny rule there.
"""

from __future__ import annotations

import logging
import os

import torch

from pagedllm.kernels import cpu_features

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
          "float": torch.float32, "half": torch.float16}
#: the environment variable that pins what `--dtype auto` means for the linear weights on CPU
AUTO_DTYPE_ENV = "PAGEDLLM_AUTO_DTYPE"
_PINNABLE = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """The compute dtype: 'auto' is float32 on CPU and bf16 (fp16 without bf16) on CUDA; a
    bf16 request on CPU computes in float32 with bf16 linear weights (`linear_dtype`)."""
    if isinstance(dtype, str) and dtype != "auto" and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of auto, {', '.join(DTYPES)}; got {dtype!r}")
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    asked = dtype if isinstance(dtype, torch.dtype) else DTYPES[dtype]
    return torch.float32 if device.type == "cpu" and asked == torch.bfloat16 else asked


def linear_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype | None:
    """The linear weights' dtype for `dtype` (validated by `resolve_dtype`); None for 'auto'
    on CPU, which `auto_linear_dtype` settles once the checkpoint is known."""
    if device.type != "cpu":
        return resolve_dtype(dtype, device)
    if dtype == "auto":
        return None
    return dtype if isinstance(dtype, torch.dtype) else DTYPES[dtype]


def auto_linear_dtype(float_weights: bool, checkpoint_dtype: object = None,
                      flags: tuple[str, ...] | None = None) -> tuple[torch.dtype, str]:
    """(linear weight dtype, why) for `--dtype auto` on CPU (module docstring's rules).

    `float_weights`: the linear weights are float once loaded; `checkpoint_dtype`: the
    config's torch_dtype / dtype (a torch.dtype or its name, None when unknown); `flags`:
    the CPU's (default: this CPU's, kernels/cpu_features.py)."""
    pinned = os.environ.get(AUTO_DTYPE_ENV, "")
    if pinned:
        if pinned not in _PINNABLE:
            raise ValueError(f"{AUTO_DTYPE_ENV} must be one of {', '.join(_PINNABLE)}; "
                             f"got {pinned!r}")
        return _PINNABLE[pinned], f"{AUTO_DTYPE_ENV}={pinned}"
    isa = cpu_features.bf16_matrix_isa(flags)
    if isa is None:
        return torch.float32, "the CPU has no bf16 matrix instructions (amx_bf16, avx512_bf16)"
    if not float_weights:
        return torch.float32, "the weights stay quantized"
    saved = str(checkpoint_dtype or "").removeprefix("torch.")
    if saved in ("float16", "half"):
        return torch.float32, ("the checkpoint is saved in float16 (bf16 would round it; "
                               "float32 holds it exactly)")
    return torch.bfloat16, f"the CPU has {isa} and the weights are float"
