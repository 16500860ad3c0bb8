"""Paged attention: the C++ decode kernel and the torch path agree with a dense reference."""

from __future__ import annotations

import pytest
import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers import attention as attn
from pagedllm.model.layers.attention import AttentionMetadata, paged_attention


def _dense_reference(q, ks, vs, scale, window=None):
    """q [H, d] against ks/vs [L, kvh, d] of one sequence (last position = L-1)."""
    h, d = q.shape
    kvh = ks.shape[1]
    k = ks.repeat_interleave(h // kvh, dim=1).transpose(0, 1)   # [H, L, d]
    v = vs.repeat_interleave(h // kvh, dim=1).transpose(0, 1)
    s = (q[:, None, :] @ k.transpose(1, 2)).squeeze(1).double() * scale  # [H, L]
    if window is not None:
        L = ks.shape[0]
        s[:, : max(0, L - window)] = float("-inf")
    p = torch.softmax(s, -1).float()
    return (p[:, None, :] @ v).squeeze(1)


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("use_kernel", [True, False])
@pytest.mark.parametrize("window", [None, 20])
def test_decode_matches_dense(block_size, use_kernel, window, monkeypatch):
    if use_kernel and cpu_ops.load() is None:
        pytest.skip("CPU kernels unavailable")
    if not use_kernel:
        monkeypatch.setattr(attn, "_use_cpu_kernel", lambda q, c: False)
    torch.manual_seed(0)
    h, kvh, d, nblocks = 6, 2, 16, 64
    k_cache = torch.randn(nblocks, block_size, kvh, d)
    v_cache = torch.randn(nblocks, block_size, kvh, d)
    lens = [1, 7, 33, 70]
    perm = torch.randperm(nblocks).tolist()
    tables, used = [], 0
    for L in lens:
        nb = -(-L // block_size)
        tables.append(perm[used:used + nb])
        used += nb
    width = max(map(len, tables))
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    q = torch.randn(len(lens), h, d)
    # New tokens' K/V are written at their slots first: use what is already there.
    slots = torch.tensor([bt[i, (L - 1) // block_size] * block_size + (L - 1) % block_size
                          for i, L in enumerate(lens)])
    k_new = k_cache.view(-1, kvh, d)[slots].clone()
    v_new = v_cache.view(-1, kvh, d)[slots].clone()
    key_pos = torch.arange(width * block_size)
    seq = torch.tensor(lens)
    mask = key_pos[None] < seq[:, None]
    if window is not None:
        mask &= key_pos[None] > (seq[:, None] - 1 - window)
    meta = AttentionMetadata(
        slot_mapping=slots, num_decodes=len(lens), decode_block_tables=bt,
        decode_key_mask=mask[:, None, None, :], decode_seq_lens=seq, sliding_window=window,
        prefill_block_tables=None, prefill_token_index=None, prefill_query_valid=None,
        prefill_mask=None)
    scale = d ** -0.5
    out = paged_attention(q, k_new, v_new, k_cache, v_cache, meta, scale).view(len(lens), h, d)
    for i, L in enumerate(lens):
        pos = torch.arange(L)
        flat = bt[i, pos // block_size] * block_size + pos % block_size
        ks = k_cache.view(-1, kvh, d)[flat]
        vs = v_cache.view(-1, kvh, d)[flat]
        ref = _dense_reference(q[i], ks, vs, scale, window)
        torch.testing.assert_close(out[i], ref, atol=1e-5, rtol=1e-4)
