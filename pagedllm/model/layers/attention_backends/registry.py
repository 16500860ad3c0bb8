"""Every attention backend by name, and the one selection a rank makes at start-up.

    name       class            runs
    triton     TritonBackend    CUDA (CPU only in Triton's interpreter): the whole batch in
                                one kernel, capturable in CUDA graphs
    cpu        CPUBackend       fp32 queries over an fp32 / int8 / fp8 cache on CPU: the C++
                                kernels, incl. the fused decode loop
    torch      TorchBackend     anything: gathered K/V and SDPA (the reference and fallback)
    training   TrainingBackend  finetuning's padded causal batches (autograd, no KV cache)

`select_backend` takes the first of `AUTO_ORDER` that supports the rank (torch supports
everything), so the choice is the one the forward pass used to make per call: Triton where
its kernels are on, the C++ kernels where they apply, torch otherwise. A new backend is one
module and one entry here.
"""

from __future__ import annotations

import torch

from pagedllm.model.layers.attention_backends.base import AttentionBackend
from pagedllm.model.layers.attention_backends.cpu import CPUBackend
from pagedllm.model.layers.attention_backends.torch_ref import TorchBackend
from pagedllm.model.layers.attention_backends.training import TrainingBackend
from pagedllm.model.layers.attention_backends.triton import TritonBackend

BACKENDS: dict[str, type[AttentionBackend]] = {
    b.name: b for b in (TritonBackend, CPUBackend, TorchBackend, TrainingBackend)}

# Serving picks the first that supports the rank; training is chosen by finetune, not here.
AUTO_ORDER = ("triton", "cpu", "torch")


def backend_class(name: str) -> type[AttentionBackend]:
    """The backend registered as `name` (ValueError naming the known ones if none is)."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown attention backend {name!r}; known: "
                         f"{', '.join(sorted(BACKENDS))}") from None


def select_backend(device: torch.device | str, dtype: torch.dtype, kv_dtype: torch.dtype,
                   head_size: int, name: str | None = None) -> AttentionBackend:
    """The backend of a rank whose model runs `dtype` activations with heads of `head_size`
    over a `kv_dtype` cache on `device`: `name` if given (ValueError if it cannot run
    them), else the first of AUTO_ORDER that supports them."""
    device = torch.device(device)
    if name is not None:
        cls = backend_class(name)
        if not cls.supports(device, dtype, kv_dtype, head_size):
            raise ValueError(f"attention backend {name!r} does not run {dtype} queries of "
                             f"head size {head_size} over a {kv_dtype} KV cache on {device}")
        return cls(device)
    # torch supports every rank, so one of them always does
    cls = next(BACKENDS[n] for n in AUTO_ORDER
               if BACKENDS[n].supports(device, dtype, kv_dtype, head_size))
    return cls(device)
