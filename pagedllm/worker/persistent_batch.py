"""Per-request batch state kept across steps and updated incrementally (vLLM v1's InputBatch
idea), so that a step's bookkeeping does not grow with the tokens generated so far.

    request  --first scheduled-->  row r  (kept while it runs, is preempted or swapped)
    block_table[r, :num_blocks[r]]   mirror of request.block_ids; a step copies only what
                                     changed (appended blocks; a rare in-place swap or a
                                     reset rewrites the row); one such table per KV group
                                     (request.block_tables[g], core/kv_groups.py)
    output_counts[p, v]              occurrences of token v in the output (penalty rows p only)
    prompt_mask[p, v]                token v occurs in the prompt (repetition penalty)
    num_counted[p]                   output tokens already in output_counts

Rows are released once their request is finished (checked at the start of each step).
Penalty state exists only for requests that use a penalty: its [rows, vocab] tensors grow
by doubling, so memory is O(penalty requests x vocab), never O(tokens).
"""

from __future__ import annotations

import numpy as np
import torch

from pagedllm.core.request import Request


def _uses_penalties(req: Request) -> bool:
    p = req.sampling_params
    return (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
            or p.repetition_penalty != 1.0)


class PersistentBatch:
    def __init__(self, vocab_size: int, device: torch.device, capacity: int = 64,
                 max_blocks: int = 64) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self._rows: dict[int, tuple[Request, int]] = {}  # id(request) -> (request, row)
        self._free: list[int] = list(range(capacity - 1, -1, -1))
        self._capacity, self._max_blocks = capacity, max_blocks
        # Per KV group g: the table rows and what each row mirrors (grown on first use).
        self._tables: list[np.ndarray] = []
        self._mirrors: list[list[list[int]]] = []
        self._group(0)
        # Penalty state, by penalty row.
        self._prow: dict[int, int] = {}  # id(request) -> penalty row
        self._pfree: list[int] = []
        self._num_counted: list[int] = []
        self.output_counts = torch.zeros(0, vocab_size, dtype=torch.int32, device=device)
        self.prompt_mask = torch.zeros(0, vocab_size, dtype=torch.bool, device=device)

    def __len__(self) -> int:
        return len(self._rows)

    # ------------------------------------------------------------ rows
    def begin_step(self) -> None:
        """Release the rows of requests that finished since the last step."""
        done = [key for key, (req, _) in self._rows.items() if req.is_finished]
        for key in done:
            _, row = self._rows.pop(key)
            for mirror in self._mirrors:
                mirror[row] = []
            self._free.append(row)
            prow = self._prow.pop(key, None)
            if prow is not None:
                self._pfree.append(prow)

    def _row(self, req: Request) -> int:
        entry = self._rows.get(id(req))
        if entry is not None:
            return entry[1]
        if not self._free:
            self._grow_rows()
        row = self._free.pop()
        self._rows[id(req)] = (req, row)
        return row

    def _grow_rows(self) -> None:
        old = self._capacity
        self._capacity *= 2
        for g, table in enumerate(self._tables):
            self._tables[g] = np.concatenate([table, np.zeros_like(table)])
            self._mirrors[g].extend([] for _ in range(old))
        self._free.extend(range(2 * old - 1, old - 1, -1))

    def _group(self, group: int) -> int:
        while len(self._tables) <= group:
            self._tables.append(np.zeros((self._capacity, self._max_blocks), np.int64))
            self._mirrors.append([[] for _ in range(self._capacity)])
        return group

    # ------------------------------------------------------ block tables
    @property
    def block_table(self) -> np.ndarray:
        return self._tables[0]

    def block_tables(self, requests: list[Request], width: int, group: int = 0) -> np.ndarray:
        """[len(requests), width] block ids, rows synced with each request's table of KV
        group `group` (block_ids for group 0)."""
        self._group(group)
        table = self._tables[group]
        if width > table.shape[1]:
            extra = max(width, 2 * table.shape[1]) - table.shape[1]
            self._tables[group] = np.pad(table, ((0, 0), (0, extra)))
        rows = np.fromiter((self._sync(r, group) for r in requests), np.int64, len(requests))
        return self._tables[group][rows, :width]

    def _sync(self, req: Request, group: int) -> int:
        row = self._row(req)
        table, mirrors = self._tables[group], self._mirrors[group]
        mirror, ids = mirrors[row], req.block_tables[group]
        if ids != mirror:  # C-level list compare: the common, unchanged case costs ~nothing
            n = len(mirror)
            if len(ids) > n and ids[:n] == mirror:  # blocks appended
                table[row, n:len(ids)] = ids[n:]
            else:  # reset (preemption), swap-in, copy-on-write, dedup, out-of-window freed
                table[row, :len(ids)] = ids
            mirrors[row] = list(ids)
        return row

    # ---------------------------------------------------------- penalties
    def penalty_tensors(self, requests: list[Request]
                        ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(output counts [B, V] int32, prompt mask [B, V] bool) for sampling rows
        `requests` (a request may appear several times), or None if none uses a penalty.
        Counts are brought up to date with the tokens appended since the last step."""
        if not any(_uses_penalties(r) for r in requests):
            return None
        rows, cols, prows = [], [], []
        for req in requests:
            if not _uses_penalties(req):
                prows.append(-1)
                continue
            prow = self._penalty_row(req)
            prows.append(prow)
            out = req.output_token_ids
            for tok in out[self._num_counted[prow]:]:
                rows.append(prow)
                cols.append(tok)
            self._num_counted[prow] = len(out)
        if rows:
            idx = torch.tensor([rows, cols], dtype=torch.int64).to(self.device)
            self.output_counts.index_put_((idx[0], idx[1]),
                                          torch.ones(len(rows), dtype=torch.int32,
                                                     device=self.device), accumulate=True)
        # Which rows use a penalty is known on the host: no device mask, no sync.
        if all(p >= 0 for p in prows):
            index = torch.tensor(prows, dtype=torch.int64).to(self.device)
            return self.output_counts[index], self.prompt_mask[index]
        used = [i for i, p in enumerate(prows) if p >= 0]
        dst = torch.tensor(used, dtype=torch.int64).to(self.device)
        src = torch.tensor([prows[i] for i in used], dtype=torch.int64).to(self.device)
        counts = torch.zeros(len(prows), self.vocab_size, dtype=torch.int32,
                             device=self.device)
        mask = torch.zeros(len(prows), self.vocab_size, dtype=torch.bool, device=self.device)
        counts[dst] = self.output_counts[src]
        mask[dst] = self.prompt_mask[src]
        return counts, mask

    def _penalty_row(self, req: Request) -> int:
        prow = self._prow.get(id(req))
        if prow is not None:
            return prow
        self._row(req)  # released with the request's row
        if not self._pfree:
            old = self.output_counts.shape[0]
            new = max(8, 2 * old)
            self.output_counts = torch.cat([self.output_counts, torch.zeros(
                new - old, self.vocab_size, dtype=torch.int32, device=self.device)])
            self.prompt_mask = torch.cat([self.prompt_mask, torch.zeros(
                new - old, self.vocab_size, dtype=torch.bool, device=self.device)])
            self._num_counted.extend([0] * (new - old))
            self._pfree.extend(range(new - 1, old - 1, -1))
        prow = self._pfree.pop()
        self._prow[id(req)] = prow
        self.output_counts[prow].zero_()
        self.prompt_mask[prow].zero_()
        self.prompt_mask[prow, torch.tensor(req.prompt_token_ids, device=self.device)] = True
        self._num_counted[prow] = 0
        return prow
