"""The K/V rows a decode step's QKV projection asks for ahead of the attention
(kernels/prefetch_plan_cpu.h; decode_kv_prefetch in kernels/paged_attention_cpu.cpp). A wrong
address costs nothing but the speed (a prefetch never faults, and the tokens cannot change),
so the spans themselves are checked here: together they are exactly the rows the attention
reads (every visible token but the new one, K and V, each byte once), each thread's are the
rows its share of the attention reads and in its order, and a budget keeps each thread's first
bytes."""

from __future__ import annotations

import pytest
import torch

from pagedllm.kernels import cpu_ops

KVH, D, BS = 3, 64, 16


def _ops():
    ops = cpu_ops.load()
    if ops is None:
        pytest.skip("CPU kernels unavailable")
    return ops


def _case(lens: list[int], dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    width = max(-(-n // BS) for n in lens)
    blocks = len(lens) * width + 3
    perm = torch.randperm(blocks, generator=g)
    tables = perm[: len(lens) * width].view(len(lens), width).contiguous()
    k = torch.zeros(blocks, BS, KVH, D, dtype=dtype)
    v = torch.zeros_like(k)
    return k, v, tables, torch.tensor(lens, dtype=torch.long)


def _rows(tables: torch.Tensor, b: int, positions: range, row: int, pool: int):
    """(pool, byte) of the given positions of sequence b, in position order."""
    out = []
    for p in positions:
        slot = int(tables[b, p // BS]) * BS + p % BS
        out.extend((pool, slot * row + i) for i in range(row))
    return out


def _visible(n: int, window: int) -> range:
    start = n - window if 0 < window < n else 0
    return range(start, max(n - 1, 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int8])
@pytest.mark.parametrize("lens,threads,window", [
    ([300], 2, 0),            # one stream: each thread a share of its tokens
    ([1, 17, 40], 4, 0),      # fewer rows than threads, a row with no earlier token
    ([5, 33, 64, 100, 16], 2, 0),  # more rows than threads: whole rows per thread
    ([90, 40, 7], 2, 32),     # a sliding window
])
def test_spans_cover_what_attention_reads(dtype, lens, threads, window):
    ops = _ops()
    k, v, tables, seq_lens = _case(lens, dtype)
    row = KVH * D * k.element_size()
    spans = ops.decode_kv_prefetch_spans(k, v, tables, seq_lens, window, threads, 1 << 40)
    assert len(spans) == threads
    got = [byte for mine in spans for s in mine for byte in _bytes_ordered(s)]
    want = [byte for b, n in enumerate(lens) for pool in (0, 1)
            for byte in _rows(tables, b, _visible(n, window), row, pool)]
    assert len(got) == len(set(got)), "a byte asked for twice"
    assert set(got) == set(want)
    for mine in spans:  # every span inside one block of one pool
        for pool, off, n in mine:
            assert pool in (0, 1) and n > 0
            assert off // (BS * row) == (off + n - 1) // (BS * row)
    if len(lens) >= threads:  # thread t: rows [t c, (t + 1) c), each row's K then its V
        c = -(-len(lens) // threads)
        for t, mine in enumerate(spans):
            order = [byte for s in mine for byte in _bytes_ordered(s)]
            rows = [byte for b in range(t * c, min(len(lens), (t + 1) * c)) for pool in (0, 1)
                    for byte in _rows(tables, b, _visible(lens[b], window), row, pool)]
            assert order == rows
    else:  # every thread its share of every row, all K before any V
        for mine in spans:
            pools = [s[0] for s in mine]
            assert pools == sorted(pools)
        for b, n in enumerate(lens):
            keys = _rows(tables, b, _visible(n, window), row, 0)
            mine_b = set(keys)
            shares = [byte for mine in spans for s in mine for byte in _bytes_ordered(s)
                      if byte in mine_b]
            assert shares == keys, "K shares out of token order"


def _bytes_ordered(span: tuple[int, int, int]) -> list[tuple[int, int]]:
    pool, off, n = span
    return [(pool, off + i) for i in range(n)]


@pytest.mark.parametrize("lens,threads", [([300], 2), ([50, 60, 70, 80], 2), ([200, 9], 4)])
def test_budget_keeps_each_threads_first_bytes(lens, threads):
    ops = _ops()
    k, v, tables, seq_lens = _case(lens, torch.float16, seed=1)
    whole = ops.decode_kv_prefetch_spans(k, v, tables, seq_lens, 0, threads, 1 << 40)
    budget = 5000  # not a multiple of a row: the last span is cut inside a row
    cut = ops.decode_kv_prefetch_spans(k, v, tables, seq_lens, 0, threads, budget)
    for all_of, first in zip(whole, cut, strict=True):
        full = [byte for s in all_of for byte in _bytes_ordered(s)]
        kept = [byte for s in first for byte in _bytes_ordered(s)]
        assert len(kept) == min(budget, len(full))
        assert kept == full[: len(kept)]


def test_bad_arguments_raise():
    ops = _ops()
    k, v, tables, seq_lens = _case([20], torch.float16)
    with pytest.raises(RuntimeError, match="decode_kv_prefetch"):
        ops.decode_kv_prefetch_spans(k, v[:, :8], tables, seq_lens, 0, 2, 1024)
    with pytest.raises(RuntimeError, match="decode_kv_prefetch"):
        ops.decode_kv_prefetch_spans(k, v, tables.int(), seq_lens, 0, 2, 1024)
