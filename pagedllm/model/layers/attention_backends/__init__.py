"""Attention backends behind one interface (base.py), registered by name (registry.py).

    base.py       AttentionBackend (the contract), PagedAttentionBackend (the metadata
                  builder of the paged KV cache), BatchLayout (what it builds from)
    torch_ref.py  torch reference: gathered K/V + SDPA, any device and dtype
    cpu.py        C++ CPU kernels (decode, varlen prefill, 8-bit writes, fused decode loop)
    triton.py     Triton kernels (CUDA; CPU in Triton's interpreter), CUDA-graph safe
    training.py   finetuning's causal padded batches (autograd, no KV cache)
    registry.py   BACKENDS, select_backend
"""

from pagedllm.model.layers.attention_backends.base import (
    AttentionBackend,
    BatchLayout,
    PagedAttentionBackend,
)
from pagedllm.model.layers.attention_backends.registry import (
    AUTO_ORDER,
    BACKENDS,
    backend_class,
    select_backend,
)

__all__ = ["AUTO_ORDER", "BACKENDS", "AttentionBackend", "BatchLayout",
           "PagedAttentionBackend", "backend_class", "select_backend"]
