"""GGUF weights multiplied with int8 activations (`--int8-activations` on a GGUF model).

The opt-in fast path for decoding, llama.cpp's own: a GGUF matrix stays in the file's block
layout, one row of blocks per output (no repack, resident bytes = the file's bytes), and at
small batch sizes each row of x is quantized per 32 values to int8, so the dot products run
as integer multiply-adds (AVX2 `maddubs`; pagedllm/kernels/quant_gguf_a8_cpu.cpp says how).
That is several times less arithmetic per weight than the exact path (`gguf.GGUFWeight`,
which dequantizes every weight to fp32), and is what decoding one stream is bound by here.

Not exact: the activation rounding moves logits slightly (docs/benchmarks.md measures the
closeness with vLLM's logprob rule). Above `INT_ROWS` rows (prefill, big batches) the kernel
dequantizes the weights exactly and runs the fp32 micro-kernel, so prefill computes what the
exact path computes. Embedding rows and `dequantize()` are exact (gguf-py's values).

Q8_0, Q4_0, Q4_1, Q4_K, Q6_K and Q5_0 matrices load as `gguf_a8_panels.GGUFA8PanelWeight`
instead: repacked for integer dot products at every batch size (W8A8; its module says why).
The rows here serve a caller that asks for them (tests, references) and the kernels' build
without the panels.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import torch
from gguf import GGMLQuantizationType, ReaderTensor

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.quant import gguf_a8_panels
from pagedllm.model.layers.quant.base import QuantizedWeight
from pagedllm.model.layers.quant.gguf import SPECS, checked_rows, matrix_type_and_shape

T = GGMLQuantizationType

# Up to this many rows of x run with int8 activations; more rows (prefill) run the exact fp32
# kernel over weights dequantized 16 rows at a time (benchmarks/quant_kernels.py measures the
# crossing).
INT_ROWS = 12
#: the row layout's kind in the C++ decode loop (LinearKind in kernels/decode_layers_cpu.cpp)
FUSED_KIND = 2


@cache
def kernels():
    """The compiled module when it has the int8-activation GGUF kernels, else None."""
    return cpu_ops.load_with("gguf_a8")


class GGUFA8Weight(QuantizedWeight):
    """A GGUF block-quantized matrix kept in the file's row layout (module docstring)."""

    def __init__(self, qtype: T, in_features: int, rows: torch.Tensor) -> None:
        super().__init__(rows.shape[0], in_features)
        self.qtype = qtype
        self.code = SPECS[qtype].code
        self.rows = rows  # uint8 [N, K / block * block_bytes]

    @property
    def format(self) -> str:  # type: ignore[override]
        return f"gguf:{self.qtype.name}+a8"

    @classmethod
    def from_blocks(cls, qtype: T, blocks: np.ndarray, shape: tuple[int, int],
                    row_order: np.ndarray | None = None, name: str = "tensor") -> GGUFA8Weight:
        """Raw GGUF bytes ([N, K / block * block_bytes] uint8) of a matrix of HF shape (N, K);
        `row_order[i]` is the GGUF row that becomes row i."""
        raw = checked_rows(qtype, blocks, shape, row_order, name)
        if kernels() is None:
            raise RuntimeError("GGUF int8-activation kernels are not built on this machine")
        return cls(qtype, shape[1], torch.from_numpy(np.ascontiguousarray(raw)))

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        return kernels().gguf_a8_linear(x, self.code, self.rows, self.in_features, INT_ROWS)

    def fused_ref(self, ops, bias: torch.Tensor | None):
        return ops.LinearRef(FUSED_KIND, self.code, self.out_features, self.in_features,
                             INT_ROWS, [self.rows], bias)

    def dequantize(self) -> torch.Tensor:
        return self.embedding(torch.arange(self.out_features))

    def embedding_ref(self, ops):
        return ops.EmbedRef(FUSED_KIND, self.code, self.out_features, self.in_features,
                            [self.rows])

    def embedding(self, token_ids: torch.Tensor) -> torch.Tensor:
        return kernels().gguf_a8_rows(token_ids.reshape(-1), self.code, self.rows,
                                      self.in_features)

    @property
    def nbytes(self) -> int:
        return self.rows.numel()

    @classmethod
    def concat(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        first = parts[0]
        assert isinstance(first, GGUFA8Weight)
        return cls(first.qtype, first.in_features,
                   torch.cat([p.rows for p in parts]))  # type: ignore[attr-defined]


def gguf_a8_weight(tensor: ReaderTensor, row_order: np.ndarray | None = None) -> QuantizedWeight:
    """`gguf.gguf_weight`'s contract, for the int8-activation kernels: the block types of
    `gguf_a8_panels.PANEL_TYPES` in its panels, the others in the file's rows."""
    qtype, shape = matrix_type_and_shape(tensor)
    return a8_weight_from_blocks(qtype, np.asarray(tensor.data), shape, row_order, tensor.name)


def a8_weight_from_blocks(qtype: T, blocks: np.ndarray, shape: tuple[int, int],
                          row_order: np.ndarray | None = None,
                          name: str = "tensor") -> QuantizedWeight:
    """`gguf_a8_weight` from raw GGUF bytes [N, K / block * block bytes] of HF shape (N, K)."""
    if qtype in gguf_a8_panels.PANEL_TYPES and gguf_a8_panels.kernels() is not None:
        return gguf_a8_panels.GGUFA8PanelWeight.from_blocks(
            qtype, blocks, shape, row_order=row_order, name=name)
    return GGUFA8Weight.from_blocks(qtype, blocks, shape, row_order=row_order, name=name)
