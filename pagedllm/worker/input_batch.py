"""Turn a SchedulerOutput into the flat tensors of one forward pass (vectorized numpy).

    requests (decodes first):   r0     r1     r2 (prefill chunk of 3, ctx_start 5)
    q_lens                       1      1      3
    positions                  [17]   [4]    [5 6 7]
    slot(pos) = block_table[pos // block_size] * block_size + pos % block_size
    logits_indices: the last token of every request that samples this step

With several KV groups (core/kv_groups.py) each group has its own block tables and slots;
`meta.groups[g]` carries them (sliding groups with their window's mask already applied).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from pagedllm.core.kv_groups import KVGroupLayout
from pagedllm.core.scheduler import ScheduledRequest
from pagedllm.model.layers.attention import AttentionMetadata
from pagedllm.worker.persistent_batch import PersistentBatch


@dataclass
class BatchInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    max_pos: int
    meta: AttentionMetadata
    order: list[ScheduledRequest]     # scheduled requests in batch order
    logits_indices: np.ndarray        # [B] flat index of each request's last token


def _key_mask(seq_lens: np.ndarray, q_pos: np.ndarray, width: int,
              window: int | None) -> np.ndarray:
    """mask[b, i, j] = key j visible to the query at absolute position q_pos[b, i]."""
    j = np.arange(width)[None, None, :]
    qp = q_pos[:, :, None]
    mask = j <= np.minimum(qp, (seq_lens - 1)[:, None, None])
    if window is not None:
        mask &= j > qp - window
    return mask


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


def build_inputs(scheduled: list[ScheduledRequest], block_size: int, device: torch.device,
                 sliding_window: int | None = None,
                 tables: PersistentBatch | None = None,
                 layout: KVGroupLayout | None = None) -> BatchInputs:
    """`tables` keeps block tables across steps (only changes are copied); without it they
    are built from the requests' block lists. `layout`: the KV groups (None: one)."""
    order = sorted(scheduled, key=lambda s: s.num_new_tokens > 1)
    n = len(order)
    q_lens = np.fromiter((s.num_new_tokens for s in order), np.int64, n)
    starts = np.fromiter((s.request.num_computed_tokens for s in order), np.int64, n)
    seq_lens = starts + q_lens
    cu = np.concatenate([[0], np.cumsum(q_lens)])
    total = int(cu[-1])
    ids = np.fromiter(
        (t for s, a in zip(order, starts, strict=True)
         for t in s.request.all_token_ids[a:a + s.num_new_tokens]), np.int64, total)
    req_idx = np.repeat(np.arange(n), q_lens)
    positions = np.arange(total) - cu[:-1][req_idx] + starts[req_idx]
    max_blocks = int(-(-seq_lens.max() // block_size))
    bt = _block_table(order, max_blocks, 0, tables)
    slots = bt[req_idx, positions // block_size] * block_size + positions % block_size

    nd = int((q_lens == 1).sum())
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    dec_bt = dec_lens = pre_bt = pre_idx = pre_valid = pre_mask = None
    if nd:  # decodes need no mask from here: the attention's torch path derives it
        width_blocks = int(-(-seq_lens[:nd].max() // block_size))
        dec_bt = to(bt[:nd, :width_blocks])
        dec_lens = to(seq_lens[:nd])
    if nd < n:
        p_q = q_lens[nd:]
        max_q = int(p_q.max())
        width_blocks = int(-(-seq_lens[nd:].max() // block_size))
        pre_bt = to(bt[nd:, :width_blocks])
        ar = np.arange(max_q)[None, :]
        valid = ar < p_q[:, None]
        pre_idx = to(np.where(valid, cu[nd:-1, None] + ar, 0))
        pre_valid = to(valid)
        q_pos = starts[nd:, None] + ar
        pre_mask = to(_key_mask(seq_lens[nd:], q_pos, width_blocks * block_size,
                                sliding_window)[:, None])   # [P, 1, max_q, L]
    meta = AttentionMetadata(
        slot_mapping=to(slots), num_decodes=nd, decode_block_tables=dec_bt,
        decode_seq_lens=dec_lens, sliding_window=sliding_window,
        prefill_block_tables=pre_bt, prefill_token_index=pre_idx,
        prefill_query_valid=pre_valid, prefill_mask=pre_mask)
    if layout is not None and layout.num_groups > 1:
        meta.groups = [meta]
        for g, group in enumerate(layout.groups[1:], 1):
            bt_g = _block_table(order, max_blocks, g, tables)
            base = meta.for_window(group.window)
            meta.groups.append(replace(
                base, _windowed={}, groups=None, decode_key_mask=None,
                slot_mapping=to(bt_g[req_idx, positions // block_size] * block_size
                                + positions % block_size),
                decode_block_tables=None if dec_bt is None else to(bt_g[:nd, :dec_bt.shape[1]]),
                prefill_block_tables=None if pre_bt is None else to(bt_g[nd:, :pre_bt.shape[1]])))
    return BatchInputs(input_ids=to(ids), positions=to(positions),
                       max_pos=int(seq_lens.max()) - 1, meta=meta, order=order,
                       logits_indices=cu[1:] - 1)
