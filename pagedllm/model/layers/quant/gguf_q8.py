"""GGUF Q8_0 weights with int8 activations: W8A8 at every batch size.

With `--int8-activations` a GGUF file's Q8_0 matrices (SmolLM2's embedding and tied
lm_head; every matrix of a Q8_0 model) are repacked once at load into panels of `kNB` output
rows (pagedllm/kernels/quant_q8_0_w8a8_cpu.cpp draws the layout), four consecutive codes of a
row in one 32-bit lane, where AVX-512 VNNI's `vpdpbusd` (or AVX2's `maddubs`) multiplies 4
codes by 4 int8 activations per lane. Each row of x is quantized per 32 values, as the
other GGUF block types' int8 path does (`gguf_a8`), and every batch size runs integer dot
products: decode steps read the file's bytes with a fraction of a per-row kernel's
instructions, and large batches and prefill get past the fp32 path's FMA ceiling (the
issue's W8A8 for Q8_0).

Resident bytes equal the file's (32 codes + one fp16 scale per block). Not exact: the
activation rounding moves logits slightly (docs/benchmarks.md). Embedding rows and
`dequantize()` are exact (gguf-py's values: d * code, one rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import torch
from gguf import GGMLQuantizationType

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.quant.base import QuantizedWeight
from pagedllm.model.layers.quant.gguf import checked_rows

_BLOCK, _BLOCK_BYTES = 32, 34  # values and bytes of a Q8_0 block: fp16 d, 32 int8 codes


@cache
def kernels():
    """The compiled module when it has the Q8_0 panel kernel, else None."""
    ops = cpu_ops.load()
    if ops is None or not hasattr(ops, "q8_0_panels_available") or not ops.q8_0_panels_available():
        return None
    return ops


class GGUFQ8Weight(QuantizedWeight):
    """A Q8_0 matrix in the W8A8 kernel's panels (module docstring).

    codes uint8 [P, K / 32, 8, NB, 4] (+ the kernel's code offset), d fp16 [P, K / 32, NB].
    """

    format = "gguf:Q8_0+a8"

    def __init__(self, out_features: int, in_features: int, codes: torch.Tensor,
                 d: torch.Tensor) -> None:
        super().__init__(out_features, in_features)
        self.codes, self.d = codes, d
        self.offset = int(kernels().q8_0_code_offset())

    @classmethod
    def from_rows(cls, codes: torch.Tensor, d: torch.Tensor) -> GGUFQ8Weight:
        """From int8 codes [N, K] and fp16 scales [N, K / 32] in row order."""
        ops = kernels()
        if ops is None:
            raise RuntimeError("the GGUF Q8_0 int8-activation kernel is not built on this machine")
        n, k = codes.shape
        nb_cols = int(ops.quant_panel_width())
        p = -(-n // nb_cols)
        pad = p * nb_cols - n
        codes = torch.nn.functional.pad(codes, (0, 0, 0, pad)).view(p, nb_cols, k // 32, 8, 4)
        d = torch.nn.functional.pad(d, (0, 0, 0, pad)).view(p, nb_cols, k // 32)
        stored = (codes.to(torch.int16) + int(ops.q8_0_code_offset())).to(torch.uint8)
        return cls(n, k, stored.permute(0, 2, 3, 1, 4).contiguous(),
                   d.permute(0, 2, 1).contiguous())

    @classmethod
    def from_blocks(cls, blocks: np.ndarray, shape: tuple[int, int],
                    row_order: np.ndarray | None = None, name: str = "tensor") -> GGUFQ8Weight:
        """Raw GGUF Q8_0 bytes ([N, K / 32 * 34] uint8) of a matrix of HF shape (N, K);
        `row_order[i]` is the GGUF row that becomes row i."""
        raw = checked_rows(GGMLQuantizationType.Q8_0, blocks, shape, row_order, name)
        n, k = shape
        blk = torch.from_numpy(np.require(raw, requirements=["C", "W"])).view(n, k // _BLOCK, _BLOCK_BYTES)
        d = blk[:, :, :2].contiguous().view(torch.float16).view(n, k // _BLOCK)
        return cls.from_rows(blk[:, :, 2:].contiguous().view(torch.int8).view(n, k), d)

    def rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(int8 codes [T, K], fp16 d [T, K / 32]) of rows `ids`, in row order."""
        nb_cols = self.codes.shape[3]
        p, c = ids // nb_cols, ids % nb_cols
        codes = self.codes[p, :, :, c, :].reshape(len(ids), self.in_features)
        return (codes.to(torch.int16) - self.offset).to(torch.int8), self.d[p, :, c]

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        return kernels().q8_0_panel_linear(x, self.codes, self.d, self.out_features)

    def embedding(self, token_ids: torch.Tensor) -> torch.Tensor:
        ids = token_ids.reshape(-1).to(torch.long)
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.out_features):
            raise IndexError(f"row ids must be in [0, {self.out_features})")
        codes, d = self.rows(ids)
        return (codes.view(len(ids), -1, _BLOCK).float()
                * d.float().unsqueeze(-1)).view(len(ids), self.in_features)

    def dequantize(self) -> torch.Tensor:
        return self.embedding(torch.arange(self.out_features))

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + 2 * self.d.numel()

    @classmethod
    def concat(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        rows = [p.rows(torch.arange(p.out_features)) for p in parts]  # type: ignore[attr-defined]
        return cls.from_rows(torch.cat([c for c, _ in rows]), torch.cat([d for _, d in rows]))
