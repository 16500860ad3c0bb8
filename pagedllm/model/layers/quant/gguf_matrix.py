"""A GGUF block-quantized matrix before its kernel layout is built: what tensor parallelism
slices.

Each kernel layout (`gguf.GGUFWeight` panels, `gguf_a8_panels`) is built once
from the file's bytes. A tensor-parallel rank needs only part of each matrix, so the loader can
hand over the file's rows unbuilt (`iter_gguf_quantized(..., unbuilt=True)`); the rank picks
its rows (output features: a column-parallel q/k/v/gate/up, a vocabulary shard) or its columns
(input features: a row-parallel o_proj / down_proj) and then `build()`s the layout from just
those bytes. Rows are free (blocks run along a row); columns split only on whole blocks (32
values, 256 for the K-quants): anything else is a clear error naming the matrix and the cut.
Nothing is dequantized: the shard holds exactly the file's bytes of its part.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from pagedllm.model.layers.quant import gguf_a8_panels
from pagedllm.model.layers.quant.base import QuantizedWeight
from pagedllm.model.layers.quant.gguf import SPECS, GGUFWeight, checked_rows

T = GGMLQuantizationType


@dataclass(frozen=True)
class GGUFMatrix:
    """`raw`: the file's rows [N_file, bytes per row] (a view of the mapped file); `row_index`
    picks and orders this matrix's rows from them (-1: a zero row, which every block type
    reads as 0.0: vocabulary padding); `columns` the [start, end) input features kept."""

    qtype: T
    raw: np.ndarray
    in_features: int
    name: str
    int8_activations: bool = False
    row_index: np.ndarray | None = None
    columns: tuple[int, int] | None = None

    @classmethod
    def of(cls, qtype: T, raw: np.ndarray, shape: tuple[int, int], name: str,
           row_order: np.ndarray | None, int8_activations: bool) -> GGUFMatrix:
        """The file's matrix of HF shape (N, K), rows in `row_order` (None: the file's)."""
        raw = checked_rows(qtype, raw, shape, None, name)
        return cls(qtype, raw, shape[1], name, int8_activations, row_order)

    @property
    def shape(self) -> tuple[int, int]:
        n = len(self.row_index) if self.row_index is not None else self.raw.shape[0]
        k = self.in_features if self.columns is None else self.columns[1] - self.columns[0]
        return n, k

    def rows(self, index: np.ndarray) -> GGUFMatrix:
        """These rows of this matrix (indices into its rows; -1 for a zero row)."""
        index = np.asarray(index, dtype=np.int64)
        current = (self.row_index if self.row_index is not None
                   else np.arange(self.raw.shape[0], dtype=np.int64))
        return replace(self, row_index=np.where(index >= 0, current[index.clip(0)], -1))

    def cols(self, start: int, end: int) -> GGUFMatrix:
        """Input features [start, end) of this matrix (whole blocks of the file's type)."""
        step = SPECS[self.qtype].super_block
        if self.columns is not None or start % step or end % step:
            n, k = self.shape
            raise ValueError(
                f"GGUF tensor {self.name!r} ({self.qtype.name}, shape ({n}, {k})) cannot be "
                f"split at input features [{start}, {end}): {self.qtype.name} blocks hold "
                f"{step} values; load the model with --quantization none to shard it dequantized")
        return replace(self, columns=(start, end))

    def blocks(self) -> np.ndarray:
        """This matrix's bytes: its rows (zeros for -1), then its columns' blocks."""
        raw = self.raw
        if self.row_index is not None:
            raw = raw[self.row_index.clip(0)]
            raw[self.row_index < 0] = 0
        if self.columns is not None:
            block, block_bytes = GGML_QUANT_SIZES[self.qtype]
            start, end = self.columns
            raw = raw[:, start // block * block_bytes:end // block * block_bytes]
        return np.ascontiguousarray(raw)

    def build(self) -> QuantizedWeight:
        """The kernel layout of these bytes, as the loader would have built it."""
        if self.int8_activations:
            return gguf_a8_panels.a8_weight_from_blocks(self.qtype, self.blocks(), self.shape,
                                                        name=self.name)
        return GGUFWeight.from_blocks(self.qtype, self.blocks(), self.shape, name=self.name)
