"""Turn a SchedulerOutput into the flat tensors of one forward pass (vectorized numpy).

    requests (decodes first):   r0     r1     r2 (prefill chunk of 3, ctx_start 5)
    q_lens                       1      1      3
    positions                  [17]   [4]    [5 6 7]
    slot(pos) = block_table[pos // block_size] * block_size + pos % block_size
    logits_indices: the last token of every request that samples this step

A request verifying draft tokens (speculative decoding: its last token + k drafts) runs on
the decode path as k + 1 decode rows, one per query token, each attending to the keys up
to its own position (all of the step's KV is written before attention reads it).

The attention metadata is built by the rank's attention backend from the host arrays
(`PagedAttentionBackend.build_metadata`, model/layers/attention_backends/base.py), with
several KV groups (core/kv_groups.py) each group's own block tables and slots in
`meta.groups[g]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from pagedllm.core.kv_groups import KVGroup, KVGroupLayout
from pagedllm.core.scheduler_output import ScheduledRequest
from pagedllm.model.layers.attention import AttentionMetadata
from pagedllm.model.layers.attention_backends import BatchLayout, PagedAttentionBackend
from pagedllm.worker.persistent_batch import PersistentBatch


@dataclass
class HostBatch:
    """The host arrays one forward pass is built from (all int64): what tensor-parallel
    rank 0 sends to the other ranks each step (pagedllm/distributed/step_message.py)."""

    input_ids: np.ndarray    # [T] the scheduled tokens, batch order
    q_lens: np.ndarray       # [n] new tokens per request
    starts: np.ndarray       # [n] num_computed_tokens per request
    block_table: np.ndarray  # [n, max_blocks]
    # The first `num_decode_reqs` requests run on the decode path, one row per query token
    # (speculative verification has 1 + k of them); None: those with one new token.
    num_decode_reqs: int | None = None
    # KV groups 1.. (core/kv_groups.py): their [n, max_blocks] tables.
    group_tables: list[np.ndarray] = field(default_factory=list)


@dataclass
class BatchInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    max_pos: int
    meta: AttentionMetadata
    order: list[ScheduledRequest]     # scheduled requests in batch order
    logits_indices: np.ndarray        # [B] flat index of each request's last token
    host: HostBatch | None = None


def _is_prefill(s: ScheduledRequest) -> bool:
    """More than one known token to compute (draft tokens do not count)."""
    return s.num_new_tokens - s.num_draft_tokens > 1


def _query_tokens(s: ScheduledRequest, start: int) -> list[int]:
    """The request's tokens from `start` on, then its scheduled draft tokens."""
    toks = s.request.all_token_ids[start:start + s.num_new_tokens]
    if s.num_draft_tokens:
        toks = toks + s.request.draft_token_ids[:s.num_draft_tokens]
    return toks


def _block_table(order: list[ScheduledRequest], width: int, group: int,
                 tables: PersistentBatch | None) -> np.ndarray:
    if tables is not None:
        return tables.block_tables([s.request for s in order], width, group)
    bt = np.zeros((len(order), width), np.int64)
    for i, s in enumerate(order):
        req = s.request
        blocks = (req.block_ids if group == 0 else req.block_tables[group])[:width]
        bt[i, :len(blocks)] = blocks
    return bt


def build_inputs(scheduled: list[ScheduledRequest], block_size: int,
                 backend: PagedAttentionBackend, tables: PersistentBatch | None = None,
                 layout: KVGroupLayout | None = None) -> BatchInputs:
    """`backend` (the rank's attention backend) builds the metadata, on its device.
    `tables` keeps block tables across steps (only changes are copied); without it they
    are built from the requests' block lists. `layout`: the KV groups, whose specs give the
    attention windows (None: one group of full attention)."""
    order = sorted(scheduled, key=_is_prefill)
    n = len(order)
    q_lens = np.fromiter((s.num_new_tokens for s in order), np.int64, n)
    starts = np.fromiter((s.request.num_computed_tokens for s in order), np.int64, n)
    seq_lens = starts + q_lens
    total = int(q_lens.sum())
    ids = np.fromiter(
        (t for s, a in zip(order, starts, strict=True) for t in _query_tokens(s, int(a))),
        np.int64, total)
    max_blocks = int(-(-seq_lens.max() // block_size))
    bt = _block_table(order, max_blocks, 0, tables)
    host = HostBatch(ids, q_lens, starts, bt, sum(1 for s in order if not _is_prefill(s)))
    if layout is not None and layout.num_groups > 1:
        host.group_tables = [_block_table(order, max_blocks, g, tables)
                             for g in range(1, layout.num_groups)]
    inputs = inputs_from_host(host, block_size, backend, layout)
    inputs.order = order
    return inputs


def inputs_from_host(host: HostBatch, block_size: int, backend: PagedAttentionBackend,
                     layout: KVGroupLayout | None = None) -> BatchInputs:
    """The device tensors and attention metadata of one forward pass (no request objects:
    tensor-parallel workers call this on the arrays rank 0 sent). The attention windows
    are the KV groups' (`layout`; None: one group of full attention)."""
    groups = layout.groups if layout is not None else (KVGroup(()),)
    ids, q_lens, starts, bt = host.input_ids, host.q_lens, host.starts, host.block_table
    n = len(q_lens)
    seq_lens = starts + q_lens
    cu = np.concatenate([[0], np.cumsum(q_lens)])
    total = int(cu[-1])
    req_idx = np.repeat(np.arange(n), q_lens)
    positions = np.arange(total) - cu[:-1][req_idx] + starts[req_idx]
    nr = (int((q_lens == 1).sum()) if host.num_decode_reqs is None
          else host.num_decode_reqs)  # decoding requests (drafts or not)
    meta = backend.build_metadata(
        BatchLayout(block_size, q_lens, seq_lens, cu, req_idx, positions, bt, nr,
                    host.group_tables, [g.window for g in groups[1:]] if host.group_tables
                    else [], groups[0].window))
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(backend.device)  # noqa: E731
    return BatchInputs(input_ids=to(ids), positions=to(positions),
                       max_pos=int(seq_lens.max()) - 1, meta=meta, order=[],
                       logits_indices=cu[1:] - 1, host=host)
