"""GGUF block-quantized weights kept quantized in memory (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K).

`gguf_weight(tensor)` turns one GGUF tensor (a `gguf.ReaderTensor`, or raw blocks with
`GGUFWeight.from_blocks`) into a `GGUFWeight`: the blocks are repacked once, here, into the
panel layout of the C++ kernel (pagedllm/kernels/quant_gguf_cpu.cpp says why and draws it):

    GGUF: row n = blocks along K      [N, K / block, block bytes]
    here: panels of NB output columns  codes [P, K, NB * bits / 8]  + per-group scales [P, G, NB]

No value changes: `dequantize()` equals `gguf.quants.dequantize` bit for bit, and `linear`
runs the same k-ordered fp32 FMA chain as the dense packed kernel, so greedy tokens equal the
`--quantization none` path. Rows permute freely (blocks run along K), which is how a loader
undoes llama.cpp's q/k rotary row order (`row_order`) without touching the blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, ReaderTensor
from gguf.quants import Q4_K

from pagedllm.errors import ModelLoadError
from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.quant.base import QuantizedWeight

T = GGMLQuantizationType


@dataclass(frozen=True)
class _Spec:
    code: int   # the kernel's format number (Fmt in quant_gguf_cpu.cpp)
    bits: int   # bits per code in the repacked layout
    group: int  # values per scale along K
    super_block: int  # values per fp16 scale (= group for the legacy types)


SPECS = {
    T.Q4_0: _Spec(0, 4, 32, 32),
    T.Q4_1: _Spec(1, 4, 32, 32),
    T.Q5_0: _Spec(2, 5, 32, 32),
    T.Q8_0: _Spec(3, 8, 32, 32),
    T.Q4_K: _Spec(4, 4, 32, 256),
    T.Q6_K: _Spec(5, 6, 16, 256),
}
#: block types that stay quantized; F32/F16/BF16 tensors load dense as before
SUPPORTED_TYPES = tuple(SPECS)
DENSE_TYPES = (T.F32, T.F16, T.BF16)

# Up to this many rows dequantize in registers, more rows dequantize each panel once into an
# L2 scratch (benchmarks/quant_kernels.py, SmolLM2's layers, 2 threads, AVX-512: in-register
# 1.2-1.7x faster than the scratch from 1 to 9 rows, level at 12-16, the scratch ahead from
# 24). Decode batches up to 12 and speculative verification (1 + k rows) stay in registers.
IN_REGISTER_ROWS = 12
#: the panel layout's kind in the C++ decode loop (LinearKind in kernels/decode_layers_cpu.cpp)
FUSED_KIND = 1


class UnsupportedQuantTypeError(ModelLoadError):
    """A GGUF tensor's block type has no quantized kernel."""


@cache
def kernels():
    """The compiled module when it has the GGUF kernels for this CPU, else None."""
    ops = cpu_ops.load()
    if ops is None or not hasattr(ops, "gguf_panel_width") or ops.gguf_panel_width() == 0:
        return None
    return ops


def available() -> bool:
    """Whether GGUF weights can stay quantized here (the CPU kernels are built)."""
    return kernels() is not None


def _f16_bits(blocks: np.ndarray, start: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., start:start + 2]).view(np.uint16)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Legacy layout: 16 bytes hold values 0..15 (low nibbles) and 16..31 (high nibbles)."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def decode_blocks(qtype: T, blocks: np.ndarray) -> dict[str, np.ndarray]:
    """Integer codes [N, K] and per-group / per-super-block scale parts of raw GGUF blocks
    [N, n_blocks, block_bytes] (the same field order gguf-py's dequantize_blocks reads)."""
    n, nb = blocks.shape[:2]
    if qtype in (T.Q4_0, T.Q4_1):
        off = 2 if qtype == T.Q4_0 else 4
        out = {"codes": _nibbles(blocks[..., off:off + 16]), "d": _f16_bits(blocks, 0)}
        if qtype == T.Q4_1:
            out["m"] = _f16_bits(blocks, 2)
    elif qtype == T.Q5_0:
        qh = np.ascontiguousarray(blocks[..., 2:6]).view(np.uint32)  # [n, nb, 1]
        hi = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        out = {"codes": _nibbles(blocks[..., 6:22]) | (hi << 4), "d": _f16_bits(blocks, 0)}
    elif qtype == T.Q8_0:
        out = {"codes": blocks[..., 2:34].view(np.int8), "d": _f16_bits(blocks, 0)}
    elif qtype == T.Q4_K:
        qs = blocks[..., 16:144].reshape(n, nb, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
        sc, mi = Q4_K.get_scale_min(np.ascontiguousarray(blocks[..., 4:16]).reshape(-1, 12))
        # Stored negated: B = (-dmin) * m = -(dmin * m) exactly, and w = fl(S * q) + B.
        out = {"codes": (qs & 15).reshape(n, nb, 256), "d": _f16_bits(blocks, 0),
               "m": _f16_bits(blocks, 2) ^ np.uint16(0x8000),
               "sc": sc.reshape(n, nb * 8), "mi": mi.reshape(n, nb * 8)}
    elif qtype == T.Q6_K:
        ql = blocks[..., 0:128].reshape(n, nb, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
        ql = (ql & 15).reshape(n, nb, 8, 32)
        qh = blocks[..., 128:192].reshape(n, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
        qh = (qh & 3).reshape(n, nb, 8, 32)
        out = {"codes": (ql | (qh << 4)).reshape(n, nb, 256), "d": _f16_bits(blocks, 208),
               "sc": blocks[..., 192:208].reshape(n, nb * 16)}
    else:
        raise UnsupportedQuantTypeError(f"no kernel for {qtype.name}")
    out["codes"] = out["codes"].reshape(n, -1)
    return out


def _panels(a: np.ndarray, nb_cols: int) -> np.ndarray:
    """[N, X] -> [P, X, NB] (output columns padded with zeros to whole panels)."""
    n = a.shape[0]
    p = -(-n // nb_cols)
    padded = np.zeros((p * nb_cols, *a.shape[1:]), dtype=a.dtype)
    padded[:n] = a
    return np.ascontiguousarray(padded.reshape(p, nb_cols, -1).transpose(0, 2, 1))


def _pack_codes(codes: np.ndarray, bits: int, nb_cols: int) -> np.ndarray:
    """Codes [P, K, NB] -> bytes [P, K, NB * bits / 8] in the kernel's row layout."""
    if bits == 8:
        return np.ascontiguousarray(codes.view(np.uint8))
    vw = nb_cols // 2
    u = codes.astype(np.uint8)
    parts = [(u[..., :vw] & 15) | ((u[..., vw:] & 15) << 4)]
    hb = bits - 4
    if hb:
        nbytes = vw * hb // 8
        shifts = (hb * np.arange(vw, dtype=np.uint64))
        for v in range(2):
            word = ((u[..., v * vw:(v + 1) * vw] >> 4).astype(np.uint64) << shifts).sum(-1)
            parts.append(word.astype("<u4").view(np.uint8).reshape(*word.shape, 4)[..., :nbytes])
    return np.ascontiguousarray(np.concatenate(parts, axis=-1))


def checked_rows(qtype: T, blocks: np.ndarray, shape: tuple[int, int],
                 row_order: np.ndarray | None, name: str) -> np.ndarray:
    """Raw GGUF bytes as uint8 rows [N, K / block * block_bytes] of a matrix of HF shape
    (N, K), rows reordered by `row_order`; clear errors for block types without a kernel and
    for sizes that do not match."""
    if qtype not in SPECS:
        raise UnsupportedQuantTypeError(
            f"GGUF tensor {name!r} has block type {qtype.name}, which has no quantized "
            f"kernel (supported: {', '.join(t.name for t in SPECS)}); load the model with "
            f"--quantization none to dequantize it")
    n, k = shape
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    if k % SPECS[qtype].super_block:
        raise UnsupportedQuantTypeError(
            f"GGUF tensor {name!r}: {k} columns are not whole {qtype.name} blocks")
    raw = np.asarray(blocks, dtype=np.uint8).reshape(n, -1)
    if raw.shape[1] != k // block * block_bytes:
        raise ValueError(f"GGUF tensor {name!r}: {raw.shape[1]} bytes per row, "
                         f"{qtype.name} x {k} columns needs {k // block * block_bytes}")
    return raw if row_order is None else raw[row_order]


class GGUFWeight(QuantizedWeight):
    """A GGUF block-quantized matrix in the kernel's panel layout (module docstring)."""

    def __init__(self, qtype: T, out_features: int, in_features: int,
                 tensors: dict[str, torch.Tensor], nb_cols: int) -> None:
        super().__init__(out_features, in_features)
        self.qtype = qtype
        self.spec = SPECS[qtype]
        self.nb_cols = nb_cols
        empty = torch.empty(0, dtype=torch.uint8)
        self.q = tensors["q"]
        self.d = tensors["d"]
        self.sc = tensors.get("sc", empty)
        self.m = tensors.get("m", empty)
        self.mi = tensors.get("mi", empty)
        # gguf_linear's arguments after x, built once: the call runs ~200 times per step
        self._linear_args = (*self.kernel_args(), IN_REGISTER_ROWS)

    @property
    def format(self) -> str:  # type: ignore[override]
        return f"gguf:{self.qtype.name}"

    @classmethod
    def from_blocks(cls, qtype: T, blocks: np.ndarray, shape: tuple[int, int],
                    row_order: np.ndarray | None = None, name: str = "tensor") -> GGUFWeight:
        """Repack raw GGUF bytes (`ReaderTensor.data`: [N, K / block * block_bytes] uint8) of a
        matrix of HF shape (N, K); `row_order[i]` is the GGUF row that becomes row i."""
        raw = checked_rows(qtype, blocks, shape, row_order, name)
        ops = kernels()
        if ops is None:
            raise RuntimeError("GGUF quantized kernels are not built on this machine")
        n, k = shape
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        spec = SPECS[qtype]
        parts = decode_blocks(qtype, raw.reshape(n, k // block, block_bytes))
        nb_cols = ops.gguf_panel_width()
        tensors = {"q": torch.from_numpy(_pack_codes(_panels(parts.pop("codes"), nb_cols),
                                                     spec.bits, nb_cols))}
        for key, value in parts.items():
            tensors[key] = torch.from_numpy(_panels(np.ascontiguousarray(value), nb_cols))
        return cls(qtype, n, k, tensors, nb_cols)

    def kernel_args(self) -> tuple:
        """(format code, N, q, d, sc, m, mi): the weight as the C++ GGUF kernels take it."""
        return (self.spec.code, self.out_features, self.q, self.d, self.sc, self.m, self.mi)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        return kernels().gguf_linear(x, *self._linear_args)

    def fused_ref(self, ops, bias: torch.Tensor | None):
        code, _, *tensors = self.kernel_args()
        return ops.LinearRef(FUSED_KIND, code, self.out_features, self.in_features,
                             IN_REGISTER_ROWS, tensors, bias)

    def dequantize(self) -> torch.Tensor:
        return kernels().gguf_dequantize(*self.kernel_args())

    def embedding_ref(self, ops):
        code, n, *packed = self.kernel_args()
        return ops.EmbedRef(FUSED_KIND, code, n, self.in_features, packed)

    def embedding(self, token_ids: torch.Tensor) -> torch.Tensor:
        code, n, *packed = self.kernel_args()
        return kernels().gguf_embedding(token_ids.reshape(-1), code, n, *packed)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.d, self.sc, self.m, self.mi))

    @classmethod
    def concat(cls, parts: Sequence[QuantizedWeight]) -> QuantizedWeight:
        # Panels hold NB rows each; parts whose row counts are not whole panels would need a
        # repack, so those run side by side (StackedQuantizedWeight) instead.
        first = parts[0]
        assert isinstance(first, GGUFWeight)
        if any(p.out_features % first.nb_cols for p in parts[:-1]):  # type: ignore[attr-defined]
            raise NotImplementedError("parts are not whole panels")
        tensors = {key: torch.cat([getattr(p, key) for p in parts]) if getattr(first, key).numel()
                   else getattr(first, key) for key in ("q", "d", "sc", "m", "mi")}
        return cls(first.qtype, sum(p.out_features for p in parts), first.in_features, tensors,
                   first.nb_cols)


def gguf_weight(tensor: ReaderTensor, row_order: np.ndarray | None = None) -> GGUFWeight:
    """The quantized weight of one 2-D GGUF tensor (independent of any model's names).

    `row_order` reorders output rows (e.g. the inverse of llama.cpp's q/k rotary permutation).
    Raises `UnsupportedQuantTypeError` naming the tensor for block types without a kernel.
    """
    qtype, shape = matrix_type_and_shape(tensor)
    return GGUFWeight.from_blocks(qtype, np.asarray(tensor.data), shape, row_order=row_order,
                                  name=tensor.name)


def matrix_type_and_shape(tensor: ReaderTensor) -> tuple[T, tuple[int, int]]:
    """A 2-D GGUF tensor's block type and HF shape (N, K); a clear error for other ranks."""
    dims = [int(d) for d in tensor.shape]
    if len(dims) != 2:
        raise ValueError(f"GGUF tensor {tensor.name!r} has shape {dims}; only matrices can "
                         f"stay quantized")
    return T(tensor.tensor_type), (dims[1], dims[0])
