"""GGUF Q8_0, Q4_0, Q4_1, Q4_K, Q6_K (and Q5_0, as Q8_0) weights with int8 activations, in
panels: W8A8 at every batch size.

With `--int8-activations` a GGUF file's matrices of these block types (SmolLM2: Q4_1 layers,
a Q8_0 embedding and tied lm_head; the common Q4_0 / Q8_0 files) are repacked once at load
into panels of `NB` output rows (pagedllm/kernels/quant_a8_panels_cpu.cpp draws the layout),
four consecutive codes of a row in one 32-bit lane, where AVX-512 VNNI's `vpdpbusd` (or
AVX2's `maddubs`) multiplies 4 codes by 4 int8 activations per lane. Each row of x is quantized
per 32 values (d = max|x| / 127, codes rounded half to even), and every batch
size runs integer dot products: a decode step reads the file's bytes with a fraction of a
per-row kernel's instructions, and large batches and prefill get past the fp32 path's FMA
ceiling (the issue's W8A8 for Q8_0).

On a CPU with AMX-bf16, a step's prompt rows can run as bf16 over the panels dequantized per
call instead (prompt_rows.py, kernels/prompt_tiles_cpu.cpp; PAGEDLLM_PROMPT_TILES), or over
the same bf16 values kept once (`keep_bf16_tiles`; prompt_tile_weights.py decides).

Resident bytes equal the file's (codes + fp16 scale (+ fp16 offset) per block; Q5_0's 22-byte
blocks take Q8_0's 34, Q4_K's 18 bytes a 32-value sub-block take 24: its scale d x sc and
offset -dmin x m in fp32, where they are exact, and Q6_K's 26.25 take 40: a byte a code and
each 16 values' d x sc in fp32), plus 2 bytes a weight where the bf16 tiles are kept. Q6_K's
scale every 16 values keeps it off the AMX-int8 tiles (two products and epilogues a block):
its decode batches run VNNI (its prompt rows take the bf16 tiles, whose B tiles hold the
scaled values). Not exact: the activation rounding moves logits
slightly (docs/benchmarks.md). Embedding rows and `dequantize()` are exact (gguf-py's values).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import torch
from gguf import GGMLQuantizationType, ReaderTensor

from pagedllm.errors import EngineError
from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.quant import prompt_rows
from pagedllm.model.layers.quant.base import LinearMethod, QuantizedWeight
from pagedllm.model.layers.quant.gguf import (
    SPECS,
    checked_rows,
    decode_blocks,
    matrix_type_and_shape,
)

T = GGMLQuantizationType
_BLOCK = 32
# bytes before the codes in a file block: d (and Q4_1's m), fp16 each
_HEADER = {T.Q8_0: 2, T.Q4_0: 2, T.Q4_1: 4}
# File types the panels take: their own, Q4_K (`_q4_k_blocks`), Q6_K (`_q6_k_blocks`) and Q5_0
# as Q8_0 panels (`_q5_0_as_q8_0`)
PANEL_TYPES = (*_HEADER, T.Q4_K, T.Q6_K, T.Q5_0)
# Byte codes (the others: 4 bits); Q6_K's stored + 32 (u8 0..63), Q8_0's + the VNNI offset
_BYTE_CODES = (T.Q8_0, T.Q6_K)
# Formats with an offset per block (w = d c + m)
_AFFINE = (T.Q4_1, T.Q4_K)
#: the panels' kind in the C++ decode loop (LinearKind in kernels/decode_layers_cpu.cpp)
FUSED_KIND = 3


@cache
def kernels():
    """The compiled module when it has the panel kernels, else None."""
    return cpu_ops.load_with("a8_panels")


def _code_offset(qtype: T) -> int:
    """What the panel layout adds to each code of `qtype` (stored as u8): VNNI's 128 for Q8_0
    where the kernels take u8 x s8 (else 0: s8 bytes), 32 for Q6_K (q - 32 stored as q), 0
    for the 4-bit codes."""
    if qtype == T.Q8_0:
        return int(kernels().q8_0_code_offset())
    return 32 if qtype == T.Q6_K else 0


def _q5_0_as_q8_0(raw: np.ndarray, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q5_0 blocks [N, K / 32 x 22] as Q8_0's (int8 codes [N, K], fp16 d [N, K / 32]): code
    q - 16 (-16..15) under the file's d, so d x code is gguf-py's value to the bit. A code a
    byte (34 bytes a block for the file's 22) buys the panels' kernels (VNNI, AMX-int8, the
    prompt tiles) in place of the per-row kernel: Gemma 3 270M's Q4_K_M file keeps most of
    its layers (q, k, v, gate, up: 640 columns, no 256-value super-blocks) in Q5_0."""
    parts = decode_blocks(T.Q5_0, raw.reshape(n, k // 32, 22))  # codes 0..31, d's bits
    codes = parts["codes"].astype(np.int16) - 16
    return torch.from_numpy(codes.astype(np.int8)), torch.from_numpy(parts["d"].view(np.float16))


def _q4_k_blocks(raw: np.ndarray, n: int, k: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K super-blocks [N, K / 256 x 144] as the panels' 32-value blocks: codes 0..15 [N, K]
    and each sub-block's S = d x sc and B = -(dmin x m) fp32 [N, K / 32], products of an fp16
    and a 6-bit integer, exact in fp32; S c + B is then gguf-py's d x sc x c - dmin x m to the
    bit."""
    parts = decode_blocks(T.Q4_K, raw.reshape(n, k // 256, 144))  # "m": -dmin's bits
    d = np.repeat(parts["d"].view(np.float16).astype(np.float32), 8, axis=1)
    neg_dmin = np.repeat(parts["m"].view(np.float16).astype(np.float32), 8, axis=1)
    scale = d * parts["sc"].astype(np.float32)
    offset = neg_dmin * parts["mi"].astype(np.float32)  # -(dmin x m), the same rounding
    return (torch.from_numpy(np.ascontiguousarray(parts["codes"])), torch.from_numpy(scale),
            torch.from_numpy(offset))


def _q6_k_blocks(raw: np.ndarray, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K super-blocks [N, K / 256 x 210] as the panels' 32-value blocks: codes q - 32
    (-32..31) int8 [N, K] and each 16-value half's S = d x sc fp32 [N, K / 32, 2], an fp16
    times an int8, exact in fp32: S x code is gguf-py's value to the bit (40 bytes a block for
    the file's 26.25; the panels' kernels in place of the per-row one at every batch size)."""
    parts = decode_blocks(T.Q6_K, raw.reshape(n, k // 256, 210))
    d = np.repeat(parts["d"].view(np.float16).astype(np.float32), 16, axis=1)
    scale = d * np.ascontiguousarray(parts["sc"]).view(np.int8).astype(np.float32)
    codes = (parts["codes"].astype(np.int16) - 32).astype(np.int8)
    return torch.from_numpy(codes), torch.from_numpy(scale.reshape(n, k // _BLOCK, 2))


def _codes(qtype: T, raw: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Per-value codes [N, K] of the file's blocks (int8 for Q8_0, 0..15 for Q4_x)."""
    body = raw[:, :, _HEADER[qtype]:]
    if qtype == T.Q8_0:
        return body.contiguous().view(torch.int8).reshape(n, k)
    # byte i of a Q4 block: value i in the low nibble, value i + 16 in the high one
    return torch.cat([body & 15, body >> 4], dim=2).reshape(n, k)


class GGUFA8PanelWeight(QuantizedWeight):
    """A Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K matrix in the int8-activation panels (module
    docstring).

    codes uint8 [P, K / 32, 8 (Q8_0, Q6_K) or 4 (Q4_x, Q4_K), NB, 4], d and m [P, K / 32, NB]
    (Q6_K's d [P, K / 32, 2, NB]: a scale per 16 values), fp16 (Q4_K, Q6_K: fp32) (m: Q4_1
    and Q4_K only, else empty); tiles: the prompt tiles' bf16 B tiles of every panel (int16
    bits) once `keep_bf16_tiles` ran, else empty.
    """

    def __init__(self, qtype: T, out_features: int, in_features: int, codes: torch.Tensor,
                 d: torch.Tensor, m: torch.Tensor) -> None:
        super().__init__(out_features, in_features)
        self.qtype, self.code = qtype, SPECS[qtype].code
        self.codes, self.d, self.m = codes, d, m
        self.offset = _code_offset(qtype)
        self.tiles = torch.empty(0, dtype=torch.int16)

    @property
    def format(self) -> str:  # type: ignore[override]
        return f"gguf:{self.qtype.name}+a8"

    @classmethod
    def from_rows(cls, qtype: T, codes: torch.Tensor, d: torch.Tensor,
                  m: torch.Tensor | None = None) -> GGUFA8PanelWeight:
        """From codes [N, K] (int8 for Q8_0 and Q6_K (q - 32), 0..15 for Q4_x and Q4_K) and d
        (and Q4_1's / Q4_K's m) [N, K / 32] (Q6_K: [N, K / 32, 2]) in row order, fp16 (Q4_K,
        Q6_K: fp32)."""
        ops = kernels()
        if ops is None:
            raise RuntimeError("GGUF int8-activation panel kernels are not built on this machine")
        n, k = codes.shape
        nb_cols = int(ops.a8_panel_width())
        p = -(-n // nb_cols)

        def panels(t: torch.Tensor) -> torch.Tensor:  # [N, ...] -> [P, K / 32, ..., NB, ...]
            t = torch.nn.functional.pad(t, (0,) * (2 * t.dim() - 1) + (p * nb_cols - n,))
            t = t.view(p, nb_cols, *t.shape[1:])
            order = {5: (0, 2, 3, 1, 4), 4: (0, 2, 3, 1), 3: (0, 2, 1)}[t.dim()]
            return t.permute(*order).contiguous()

        blocks = codes.view(n, k // _BLOCK, _BLOCK)
        if qtype in _BYTE_CODES:  # lane g: codes 4g..4g+3, as u8 (offset VNNI's / Q6_K's)
            lanes = (blocks.to(torch.int16) + _code_offset(qtype)).to(torch.uint8)
            lanes = lanes.view(n, k // _BLOCK, 8, 4)
        else:  # lane u: codes 8u + b (low nibble), 8u + 4 + b (high)
            pairs = blocks.to(torch.uint8).view(n, k // _BLOCK, 4, 2, 4)
            lanes = pairs[:, :, :, 0] | (pairs[:, :, :, 1] << 4)
        empty = torch.empty(0, dtype=torch.float16)
        return cls(qtype, n, k, panels(lanes), panels(d),
                   panels(m) if qtype in _AFFINE else empty)

    @classmethod
    def from_blocks(cls, qtype: T, blocks: np.ndarray, shape: tuple[int, int],
                    row_order: np.ndarray | None = None,
                    name: str = "tensor") -> GGUFA8PanelWeight:
        """Raw GGUF bytes ([N, K / 32 * block bytes] uint8) of a matrix of HF shape (N, K);
        `row_order[i]` is the GGUF row that becomes row i."""
        if qtype not in PANEL_TYPES:
            raise ValueError(f"GGUF tensor {name!r}: {qtype.name} has no panel kernel "
                             f"(supported: {', '.join(t.name for t in PANEL_TYPES)})")
        raw = checked_rows(qtype, blocks, shape, row_order, name)
        n, k = shape
        if qtype == T.Q4_K:
            return cls.from_rows(T.Q4_K, *_q4_k_blocks(np.asarray(raw), n, k))
        if qtype == T.Q6_K:
            return cls.from_rows(T.Q6_K, *_q6_k_blocks(np.asarray(raw), n, k))
        if qtype == T.Q5_0:
            return cls.from_rows(T.Q8_0, *_q5_0_as_q8_0(np.asarray(raw), n, k))
        blk = torch.from_numpy(np.require(raw, requirements=["C", "W"])).view(n, k // _BLOCK, -1)
        half = blk[:, :, :_HEADER[qtype]].contiguous().view(torch.float16)
        m = half[:, :, 1] if qtype == T.Q4_1 else None
        return cls.from_rows(qtype, _codes(qtype, blk, n, k), half[:, :, 0], m)

    def rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(codes [T, K], d [T, K / 32] (Q6_K: [T, K / 32, 2]), m [T, K / 32] or None) of rows
        `ids`, in row order: from_rows' arguments."""
        nb_cols = self.codes.shape[3]
        p, c = ids // nb_cols, ids % nb_cols
        lanes = self.codes[p, :, :, c, :]  # [T, K / 32, lanes, 4]
        if self.qtype in _BYTE_CODES:
            codes = (lanes.to(torch.int16) - self.offset).to(torch.int8)
        else:
            codes = torch.stack([lanes & 15, lanes >> 4], dim=3)  # [T, K / 32, 4, 2, 4]
        m = self.m[p, :, c] if self.qtype in _AFFINE else None
        d = self.d[p, :, :, c] if self.qtype == T.Q6_K else self.d[p, :, c]
        return codes.reshape(len(ids), self.in_features), d, m

    def keep_bf16_tiles(self) -> int:
        """Keeps the prompt tiles' bf16 B tiles of every panel (the values their calls
        dequantize, the same bits), so those calls skip the dequantization; returns the
        bytes kept."""
        self.tiles = kernels().a8_panel_bf16_tiles(self.code, self.codes, self.d, self.m,
                                                   self.out_features, self.in_features)
        return self.tiles.numel() * self.tiles.element_size()

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """int8 activations; a step's prompt rows on the bf16 tiles when they are chosen
        (prompt_rows.py: the runner scopes them only then)."""
        ops = kernels()
        args = (self.code, self.codes, self.d, self.m, self.out_features)
        step = prompt_rows.matrices_step(x.shape[0])
        if step is None:
            return ops.a8_panel_linear(x, *args)
        return step.apply(x, lambda rows: ops.a8_panel_bf16_linear(rows, *args, self.tiles),
                          lambda rows: ops.a8_panel_linear(rows, *args))

    def gated_mlp(self, down: LinearMethod, x: torch.Tensor) -> torch.Tensor | None:
        """One `a8_panel_mlp` call (the bits of `linear`, `silu_mul`, `down.linear`, without
        the fp32 [M, 2 I] product in between: kernels/quant_a8_panels_cpu.cpp) when `down` is
        panels too, taking the intermediate size I (then whole 32-value blocks, as every panel
        matrix's input); a step's prompt rows in one `a8_panel_bf16_mlp` call on the bf16
        tiles (prompt_rows.py; the bits of the three calls there); None for anything else."""
        inter = self.out_features // 2
        if (type(down) is not GGUFA8PanelWeight or x.device.type != "cpu"
                or x.dtype != torch.float32 or x.dim() != 2
                or self.out_features != 2 * down.in_features):
            return None
        ops = kernels()
        args = (self.code, self.codes, self.d, self.m, down.code, down.codes, down.d, down.m,
                inter, down.out_features)
        x = x.contiguous()
        step = prompt_rows.matrices_step(x.shape[0])
        if step is None:
            return ops.a8_panel_mlp(x, *args)
        return step.apply(x, lambda rows: ops.a8_panel_bf16_mlp(rows, *args, self.tiles,
                                                                down.tiles),
                          lambda rows: ops.a8_panel_mlp(rows, *args))

    def fused_ref(self, ops, bias: torch.Tensor | None):
        return ops.LinearRef(FUSED_KIND, self.code, self.out_features, self.in_features, 0,
                             [self.codes, self.d, self.m], bias)

    def embedding_ref(self, ops):
        return ops.EmbedRef(FUSED_KIND, self.code, self.out_features, self.in_features,
                            [self.codes, self.d, self.m])

    def embedding(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Exact rows: d * code (Q8_0), d * (code - 8) (Q4_0), d * code + m (Q4_1, Q4_K), S *
        code (Q6_K, S its 16 values'), gguf-py's roundings; one C++ call (a decode step's embedding took ~10 torch ops, ~0.2 ms
        after the layers had streamed the weights through the caches)."""
        ids = token_ids.reshape(-1).to(torch.long)
        if ids.device.type == "cpu" and (ops := kernels()) is not None:
            return ops.a8_panel_rows(ids.contiguous(), self.code, self.codes, self.d, self.m,
                                     self.out_features, self.in_features)
        return self.embedding_reference(ids)

    def embedding_reference(self, ids: torch.Tensor) -> torch.Tensor:
        """`embedding` in torch ops (the C++ rows equal it to the bit)."""
        if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.out_features):
            raise IndexError(f"row ids must be in [0, {self.out_features})")
        codes, d, m = self.rows(ids)
        group = _BLOCK // 2 if self.qtype == T.Q6_K else _BLOCK  # values a scale
        values = codes.view(len(ids), -1, group).float()
        if self.qtype == T.Q4_0:
            values = values - 8
        w = values * d.float().reshape(len(ids), -1, 1)
        if m is not None:
            w = w + m.float().unsqueeze(-1)
        return w.reshape(len(ids), self.in_features)

    def dequantize(self) -> torch.Tensor:
        return self.embedding(torch.arange(self.out_features))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.d, self.m, self.tiles))

    @classmethod
    def concat(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        rows = [p.rows(torch.arange(p.out_features)) for p in parts]  # type: ignore[attr-defined]
        qtype = parts[0].qtype  # type: ignore[attr-defined]
        m = torch.cat([r[2] for r in rows]) if qtype in _AFFINE else None
        return cls.from_rows(qtype, torch.cat([r[0] for r in rows]),
                             torch.cat([r[1] for r in rows]), m)


def gguf_a8_weight(tensor: ReaderTensor, row_order: np.ndarray | None = None) -> QuantizedWeight:
    """`gguf.gguf_weight`'s contract for the int8-activation kernels: the matrix in panels."""
    qtype, shape = matrix_type_and_shape(tensor)
    return a8_weight_from_blocks(qtype, np.asarray(tensor.data), shape, row_order, tensor.name)


def a8_weight_from_blocks(qtype: T, blocks: np.ndarray, shape: tuple[int, int],
                          row_order: np.ndarray | None = None,
                          name: str = "tensor") -> GGUFA8PanelWeight:
    """`gguf_a8_weight` from raw GGUF bytes [N, K / block * block bytes] of HF shape (N, K);
    a clear error where this machine's kernels lack the panels (a build without AVX2)."""
    if kernels() is None:
        raise EngineError("GGUF int8-activation kernels are not built on this machine "
                          "(run without --int8-activations)")
    return GGUFA8PanelWeight.from_blocks(qtype, blocks, shape, row_order=row_order, name=name)
