"""The batch bitmask touches exactly the constrained rows: disallowed logits -inf, the rest
bit-identical; and a whole-batch mask equals the per-row reference."""

from __future__ import annotations

import numpy as np
import torch

from pagedllm.structured_output.bitmask import GrammarBitmask


def _reference(logits: torch.Tensor, rows: list[int], bitmask: np.ndarray) -> torch.Tensor:
    out = logits.clone()
    for r, row in enumerate(rows):
        for t in range(logits.shape[1]):
            if not (int(bitmask[r, t // 32]) >> (t % 32)) & 1:
                out[row, t] = float("-inf")
    return out


def test_bitmask_rows_and_bits():
    g = torch.Generator().manual_seed(0)
    vocab = 100  # not a multiple of 32: the last word's high bits are ignored
    logits = torch.randn(5, vocab, generator=g)
    rng = np.random.default_rng(0)
    for rows in ([1, 3], [0, 1, 2, 3, 4]):
        bm = rng.integers(-2**31, 2**31 - 1, size=(len(rows), 4), dtype=np.int64).astype(np.int32)
        want = _reference(logits, rows, bm)
        got = GrammarBitmask(rows, bm).apply(logits.clone())
        assert torch.equal(got, want)
        free = [i for i in range(5) if i not in rows]
        assert torch.equal(got[free], logits[free])
