"""The compact per-step message tensor-parallel rank 0 sends to the other ranks.

Everything a rank needs to mirror a step, as int64 arrays (no request objects, no pickle)::

    [kind, n_arrays, (ndim, dim0, dim1) x n_arrays | payload: the arrays, flattened]

    arrays: input_ids [T] · q_lens [n] · starts [n] · block_table [n, B] · logits_rows [R]
            swap_out [k, 2] · swap_in [k, 2] · copies [k, 2]

A step with nothing scheduled (only swaps / copies) has n = 0. SHUTDOWN carries no arrays.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from pagedllm.worker.input_batch import HostBatch


class Kind(enum.IntEnum):
    STEP = 1
    SHUTDOWN = 2


_FIELDS = ("input_ids", "q_lens", "starts", "block_table", "logits_rows", "swap_out",
           "swap_in", "copies")


def _pairs(pairs: list[tuple[int, int]]) -> np.ndarray:
    return np.asarray(pairs, np.int64).reshape(-1, 2)


@dataclass
class StepMessage:
    kind: Kind
    host: HostBatch | None = None          # None: nothing scheduled this step
    logits_rows: np.ndarray | None = None  # [R] hidden rows rank 0 computes logits for
    swap_out: np.ndarray | None = None     # [k, 2] (device block, swap block)
    swap_in: np.ndarray | None = None      # [k, 2] (swap block, device block)
    copies: np.ndarray | None = None       # [k, 2] (src block, dst block)

    @classmethod
    def step(cls, host: HostBatch | None, logits_rows: list[int], swap_out, swap_in,
             copies) -> StepMessage:
        return cls(Kind.STEP, host, np.asarray(logits_rows, np.int64), _pairs(swap_out),
                   _pairs(swap_in), _pairs(copies))

    def encode(self) -> bytes:
        if self.kind is Kind.SHUTDOWN:
            return np.array([Kind.SHUTDOWN, 0], np.int64).tobytes()
        h = self.host
        empty = np.zeros(0, np.int64)
        arrays = [h.input_ids if h else empty, h.q_lens if h else empty,
                  h.starts if h else empty,
                  h.block_table if h else np.zeros((0, 0), np.int64),
                  self.logits_rows, self.swap_out, self.swap_in, self.copies]
        header = [int(self.kind), len(arrays)]
        for a in arrays:
            header += [a.ndim, a.shape[0], a.shape[1] if a.ndim == 2 else 0]
        parts = [np.asarray(header, np.int64)]
        parts += [np.ascontiguousarray(a, np.int64).ravel() for a in arrays]
        return np.concatenate(parts).tobytes()

    @classmethod
    def decode(cls, data: bytes) -> StepMessage:
        buf = np.frombuffer(data, np.int64).copy()  # writable: torch.from_numpy views it
        kind = Kind(int(buf[0]))
        if kind is Kind.SHUTDOWN:
            return cls(kind)
        n = int(buf[1])
        if n != len(_FIELDS):
            raise ValueError(f"step message has {n} arrays, expected {len(_FIELDS)}")
        dims = buf[2:2 + 3 * n].reshape(n, 3)
        offset = 2 + 3 * n
        values = {}
        for name, (ndim, d0, d1) in zip(_FIELDS, dims.tolist(), strict=True):
            size = d0 * (d1 if ndim == 2 else 1)
            a = buf[offset:offset + size]
            values[name] = a.reshape(d0, d1) if ndim == 2 else a
            offset += size
        host = (HostBatch(values["input_ids"], values["q_lens"], values["starts"],
                          values["block_table"]) if len(values["q_lens"]) else None)
        return cls(kind, host, values["logits_rows"], values["swap_out"], values["swap_in"],
                   values["copies"])
