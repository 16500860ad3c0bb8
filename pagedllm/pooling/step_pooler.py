"""The runner's pooling hook: each step, the pooled part of every pooling request's chunk.

    batch rows    | r0 decode | r1: prompt positions 8..11 (chunk 2 of 3)   | r2 ...
    hidden        [ h        | h8  h9  h10 h11                             | ...
    MEAN          r1 -> h8 + h9 + h10 + h11 (summed in float32, chunk by chunk)
    LAST          r1 -> the row of the prompt's last position, in the chunk that holds it
    CLS           r1 -> the row of position 0, in the first chunk
    ALL           r1 -> [h8 h9 h10 h11] (the request appends them)

A classification model's `score` head is linear without bias, so it is applied to each part
(score(sum) = sum of scores): the request accumulates num_labels numbers per chunk instead of
hidden_size. The parts leave the device in one copy per step; `Request.add_pooled` (called
by `Scheduler.update_from_output`) sums them and pooling/finalize.py makes the vector.
"""

from __future__ import annotations

import torch
from torch import nn

from pagedllm.core.runner_output import PooledChunk


class StepPooler:
    """Pools the step's pooling requests (`pooling_type` LAST / MEAN / CLS); `head`: the
    classifier's score layer (None for embeddings)."""

    def __init__(self, pooling_type: str, head: nn.Module | None = None) -> None:
        self.pooling_type = pooling_type
        self.head = head

    def pool(self, batch, hidden: torch.Tensor) -> list[PooledChunk]:
        """One PooledChunk per pooling request of `batch` (BatchInputs), in batch order."""
        chunks: list[PooledChunk] = []
        rows: list[torch.Tensor] = []
        picked: list[bool] = []  # whether each chunk has a row in `rows`
        for s, last in zip(batch.order, batch.logits_indices, strict=True):
            req = s.request
            if req.pooling_params is None:
                continue
            first, n, last = req.num_computed_tokens, s.num_new_tokens, int(last)
            row = None
            if self.pooling_type == "MEAN":
                row = hidden[last - n + 1 : last + 1].float().sum(0)
            elif self.pooling_type == "LAST" and first + n >= req.num_prompt_tokens:
                row = hidden[last].float()
            elif self.pooling_type == "CLS" and first == 0:
                row = hidden[last - n + 1].float()
            elif self.pooling_type == "ALL":
                row = hidden[last - n + 1 : last + 1].float()
            chunks.append(PooledChunk(req, first, n, None))
            picked.append(row is not None)
            if row is not None:
                rows.append(row)
        if not rows:
            return chunks
        per_token = self.pooling_type == "ALL"
        flat = torch.cat(rows) if per_token else torch.stack(rows)
        if self.head is not None:
            flat = self.head(flat.to(hidden.dtype)).float()
        host = iter(flat.cpu().split([len(r) for r in rows]) if per_token else flat.cpu())
        for chunk, has_row in zip(chunks, picked, strict=True):
            if has_row:
                chunk.data = next(host)
        return chunks
