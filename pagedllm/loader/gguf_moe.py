"""Mixture-of-experts tensors in GGUF files, and Mixtral as llama.cpp writes it.

llama.cpp stacks each layer's experts into one tensor per projection (``ffn_gate_exps``
[E, I, H], ``ffn_up_exps``, ``ffn_down_exps``); HF checkpoints hold one tensor per expert.
:mod:`gguf_loader` names a stacked tensor with a ``{}`` for the expert index and splits it
here: dequantized arrays by their first axis (`split`), quantized blocks as one 2-D view per
expert (`expert_views`), so each expert's matrix stays in the file's blocks.

Mixtral is written as the ``llama`` architecture with ``llama.expert_count`` /
``llama.expert_used_count`` and a router ``ffn_gate_inp``; its q/k rows are permuted as any
llama file's (gguf_loader undoes that).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
from gguf import ReaderTensor
from transformers import MixtralConfig

from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.loader.gguf_arch import common_config, head_dim

# Stacked expert tensors -> the HF per-expert name, "{}" standing for the expert index.
EXPERT_NAMES = {
    "ffn_gate_exps": "mlp.experts.{}.gate_proj",
    "ffn_up_exps": "mlp.experts.{}.up_proj",
    "ffn_down_exps": "mlp.experts.{}.down_proj",
}
# Per-layer names a llama-architecture MoE file adds to llama's (router and experts).
LLAMA_MOE_NAMES = {"ffn_gate_inp": "mlp.gate", **EXPERT_NAMES}


def is_llama_moe(meta: Callable[..., Any]) -> bool:
    """Whether a ``llama`` GGUF file holds a mixture of experts (Mixtral)."""
    return int(meta("llama.expert_count", 0) or 0) > 0


def mixtral_config(
    meta: Callable[..., Any], tensor_shapes: dict[str, tuple[int, ...]]
) -> MixtralConfig:
    """A ``MixtralConfig`` from a llama-architecture MoE file's metadata (``meta(key,
    default)``) and the HF-order shapes of its tensors."""
    base = common_config("llama", meta, tensor_shapes)
    if "blk.0.ffn_gate_exps.weight" not in tensor_shapes:
        raise UnsupportedModelError(
            "GGUF llama MoE file without stacked ffn_*_exps tensors "
            "(an older per-expert layout) is not supported"
        )
    scaling = meta("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise UnsupportedModelError(f"GGUF Mixtral rope scaling {scaling!r} is not supported")
    base["intermediate_size"] = int(
        meta("llama.expert_feed_forward_length", None) or base["intermediate_size"])
    return MixtralConfig(
        architectures=["MixtralForCausalLM"],
        head_dim=head_dim("llama", meta),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(meta("llama.rope.freq_base", 1e6)),
        },
        num_local_experts=int(meta("llama.expert_count")),
        num_experts_per_tok=int(meta("llama.expert_used_count")),
        sliding_window=None,
        **base,
    )


def hf_specs(name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """The HF (name, shape) of every tensor a GGUF tensor of HF `name` / `shape` becomes:
    one per expert for stacked experts, the shared-expert gate as one row."""
    if "{}" in name:
        return [(name.format(e), shape[1:]) for e in range(shape[0])]
    if name.endswith("shared_expert_gate.weight") and len(shape) == 1:
        return [(name, (1, shape[0]))]
    return [(name, shape)]


def split(name: str, array: np.ndarray) -> Iterator[tuple[str, np.ndarray]]:
    """A dequantized GGUF tensor under its HF name(s) (see `hf_specs`)."""
    for (hf_name, shape), part in zip(
        hf_specs(name, array.shape),
        array if "{}" in name else [array],
        strict=True,
    ):
        yield hf_name, part.reshape(shape)


def expert_views(tensor: ReaderTensor) -> list[SimpleNamespace]:
    """Each expert's matrix of a stacked quantized expert tensor, as a 2-D tensor view that
    the GGUF weight constructors take (ggml dimension order: [K, N, E] -> [K, N])."""
    k, n, experts = (int(d) for d in tensor.shape)
    data = np.asarray(tensor.data)
    return [
        SimpleNamespace(
            name=f"{tensor.name}[{e}]", tensor_type=tensor.tensor_type, shape=[k, n], data=data[e]
        )
        for e in range(experts)
    ]
