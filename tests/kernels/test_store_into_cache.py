"""`store_into_cache` (kernels/paged_attention_cpu.cpp): the CPU backend's K / V write for fp32
and float16 caches, straight from the strided qkv rows, gives the bits of
`cache.index_copy_(0, slots, x.to(cache.dtype))` (what the torch backend does): values across
float16's range (subnormal, overflow to inf, negative zero), shuffled slots, row counts around
the thread split; bad shapes are one clear error."""

from __future__ import annotations

import pytest
import torch

from pagedllm.kernels import cpu_ops


def _ops():
    """The core kernels (the suite sets PAGEDLLM_REQUIRE_CPU_KERNELS: a failed build raises)."""
    return cpu_ops.load()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("t", [1, 7, 64, 130])
def test_equals_convert_and_index_copy(dtype, t):
    ops = _ops()
    gen = torch.Generator().manual_seed(t)
    kvh, d, h = 3, 40, 9  # a row of 120 values: vector body and scalar tail
    qkv = torch.randn(t, (h + 2 * kvh) * d, generator=gen)
    scale = torch.tensor([1e-8, 3e-6, 1e-3, 1.0, 70000.0, -0.0])
    qkv *= scale[torch.randint(len(scale), qkv.shape, generator=gen)]
    k = qkv[:, h * d:(h + kvh) * d].view(t, kvh, d)  # strided rows, as the model's view
    slots = torch.randperm(200, generator=gen)[:t]
    got = torch.full((25, 8, kvh, d), 7.0, dtype=dtype)
    want = got.clone()
    ops.store_into_cache(k, got, slots)
    want.view(-1, kvh, d).index_copy_(0, slots, k.to(dtype))
    assert torch.equal(got.view(torch.int16 if dtype == torch.float16 else torch.int32),
                       want.view(torch.int16 if dtype == torch.float16 else torch.int32))


def test_bad_input_is_one_clear_error():
    ops = _ops()
    cache = torch.zeros(4, 8, 2, 16, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="x must be fp32"):
        ops.store_into_cache(torch.zeros(3, 2, 16, dtype=torch.float64), cache,
                             torch.arange(3))
    with pytest.raises(RuntimeError, match="rows of 32 values, 2 slots"):
        ops.store_into_cache(torch.zeros(3, 2, 16), cache, torch.arange(2))
    with pytest.raises(RuntimeError, match="int64 slots"):
        ops.store_into_cache(torch.zeros(3, 2, 16), cache.to(torch.bfloat16), torch.arange(3))
