"""Triton kernels of the CUDA path, with the call signatures of the C++ CPU kernels.

    attention.py   paged attention over the block tables: decode (one query per sequence)
                   and varlen prefill / chunked prefill (cached context + new tokens) in one
                   kernel; GQA, fp32 softmax, sliding window, soft-capping, int8 / fp8 KV
    kv_write.py    new K/V rows into their slots, quantized (int8 / fp8 + float16 scales,
                   bit-identical to kv_quant.quantize) when the cache is 8-bit
    fused.py       fused residual-add + RMSNorm (Llama and Gemma forms) and NeoX RoPE on
                   the q / k heads of fused qkv rows
    fused_moe.py   a MoE layer's routed experts: grouped GEMMs over the token rows sorted
                   by expert (gate_up -> SiLU * up -> down, weighted combine)

`enabled(x)` decides whether the forward pass uses them for tensor `x`: on CUDA when triton
imports, unless PAGEDLLM_ATTENTION_BACKEND=torch; PAGEDLLM_ATTENTION_BACKEND=triton also
uses them on CPU tensors, which only works in Triton's interpreter (TRITON_INTERPRET=1, set
before triton is imported) and is how CI runs the whole CUDA path on a machine without GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

BACKENDS = ("auto", "triton", "torch")


def backend() -> str:
    name = os.environ.get("PAGEDLLM_ATTENTION_BACKEND", "auto")
    if name not in BACKENDS:
        raise ValueError(f"PAGEDLLM_ATTENTION_BACKEND must be one of {', '.join(BACKENDS)}; "
                         f"got {name!r}")
    return name


@functools.cache
def available() -> bool:
    """triton is installed (it is not on every CPU-only machine)."""
    return importlib.util.find_spec("triton") is not None


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def enabled_for(device: torch.device | str) -> bool:
    """Whether the forward pass runs the Triton kernels on tensors of `device`."""
    device = torch.device(device)
    name = backend()
    if name == "torch" or not available():
        return False
    if device.type == "cuda":
        return True
    return name == "triton" and device.type == "cpu" and interpreted()


def enabled(x: torch.Tensor) -> bool:
    """`enabled_for(x.device)`, asked by several layers in every forward pass: on CPU the
    answer is no unless Triton's interpreter is on, which one environment read settles (the
    full check cost ~0.6 ms of a ~14 ms SmolLM2 decode step)."""
    if x.device.type == "cpu" and not interpreted():
        return False
    return enabled_for(x.device)
