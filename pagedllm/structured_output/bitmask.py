"""A batch's grammar bitmask and its application to the logits (torch + numpy only).

    bitmask[r, w] (int32): bit j set  <=>  token 32 * w + j is allowed in row rows[r]

Only the rows that are constrained have a bitmask row; the others are untouched. Applying
it adds 0 to allowed logits and -inf to the rest (an additive mask: on CPU this is ~5x
faster than `masked_fill` / `torch.where` with a boolean mask).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class GrammarBitmask:
    rows: list[int]  # sampler rows the bitmask rows belong to
    bitmask: np.ndarray  # [len(rows), ceil(V / 32)] int32

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Set the disallowed logits of the constrained rows to -inf (in place; returned)."""
        vocab = logits.shape[-1]
        bits = np.unpackbits(self.bitmask.view(np.uint8), axis=1, count=vocab,
                             bitorder="little")
        # allowed -> (1 - 1) * inf = nan -> 0; disallowed -> -inf
        bias = torch.from_numpy(bits).to(logits.device, non_blocking=True).float()
        bias = bias.sub_(1.0).mul_(float("inf")).nan_to_num_(0.0, neginf=float("-inf"))
        if len(self.rows) == logits.shape[0]:
            return logits.add_(bias)
        idx = torch.tensor(self.rows, dtype=torch.int64, device=logits.device)
        return logits.index_add_(0, idx, bias)  # one pass (`logits[idx] += bias` takes three)
