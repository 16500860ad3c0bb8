"""Which heads / KV heads / vocabulary rows each tensor-parallel rank holds."""

from __future__ import annotations

import pytest

from pagedllm.distributed.sharding import TPLayout


def layout(heads, kv_heads, n, rank=0, vocab=100):
    return TPLayout(rank, n, heads, kv_heads, 8, 16 * n, vocab)


@pytest.mark.parametrize(("heads", "kv", "n", "expected"), [
    (8, 4, 2, [[0, 1], [2, 3]]),             # KV heads split
    (4, 1, 2, [[0], [0]]),                   # replicated: kv_heads < N
    (6, 3, 2, [[0, 0, 1], [1, 2, 2]]),       # one KV copy per query head
    (9, 3, 2, [[0], [1, 2]]),                # SmolLM2-135M: whole groups, 3 + 6 heads
])
def test_kv_heads_per_rank(heads, kv, n, expected):
    got = [layout(heads, kv, n, r).local_kv_heads for r in range(n)]
    assert got == expected
    assert sum(layout(heads, kv, n, r).local_heads for r in range(n)) == heads


def test_vocab_padding_and_refusals():
    assert layout(4, 2, 2, vocab=515).vocab_shard == 258
    with pytest.raises(ValueError, match="must divide the model's 9 attention heads"):
        layout(9, 1, 2)
    with pytest.raises(ValueError, match="intermediate_size"):
        TPLayout(0, 2, 4, 2, 8, 15, 100)
