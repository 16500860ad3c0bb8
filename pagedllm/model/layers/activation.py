"""Gated activations over fused [gate | up] rows: Llama's `silu(gate) * up`, Gemma's
`gelu_tanh(gate) * up`.

On CPU in fp32 one C++ call (pagedllm/kernels/fused_cpu.cpp) replaces the split, the
activation and the product; elsewhere the torch ops run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pagedllm.kernels import cpu_ops


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2 * inter] -> [..., inter]."""
    if (ops := cpu_ops.fp32_ops(gate_up)) is not None and gate_up.dim() == 2:
        return ops.silu_mul(gate_up.contiguous())
    gate, up = gate_up.chunk(2, -1)
    return F.silu(gate) * up


def gelu_tanh_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2 * inter] -> [..., inter]: gelu(gate, approximate="tanh") * up."""
    if (ops := cpu_ops.fp32_ops(gate_up)) is not None and gate_up.dim() == 2:
        return ops.gelu_tanh_mul(gate_up.contiguous())
    gate, up = gate_up.chunk(2, -1)
    return F.gelu(gate, approximate="tanh") * up
