"""CacheEngine: pool shapes and bytes match KVCacheSpec, and block copies / swaps move the
int8 / fp8 scales with their values."""

from __future__ import annotations

import pytest
import torch

from pagedllm.config import KVCacheSpec
from pagedllm.model.layers import kv_quant
from pagedllm.worker.cache_engine import CacheEngine

DTYPES = [torch.float32, torch.int8, torch.float8_e4m3fn, torch.float8_e5m2]


def _engine(dtype: torch.dtype, num_blocks: int = 6, num_swap_blocks: int = 0) -> CacheEngine:
    spec = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=8, dtype=dtype, block_size=4)
    engine = CacheEngine(spec, num_blocks, torch.device("cpu"), num_swap_blocks)
    torch.manual_seed(0)
    for layer in engine.layer_caches:      # fill every slot through the write path's views
        for pool, scales in ((layer.k, layer.k_scale), (layer.v, layer.v_scale)):
            x = torch.randn(pool.shape)
            if scales is None:
                pool.copy_(x)
            else:
                values, s = kv_quant.quantize(x, dtype)
                kv_quant.raw(pool).copy_(kv_quant.raw(values))
                scales.copy_(s)
    return engine


def _block(engine: CacheEngine, b: int) -> list[torch.Tensor]:
    return [kv_quant.raw(p)[:, :, b].clone() for p in engine.pools]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pool_bytes_match_the_spec(dtype) -> None:
    engine = _engine(dtype)
    spec = engine.spec
    assert sum(p.nbytes for p in engine.pools) == engine.num_blocks * spec.bytes_per_block
    elem = torch.empty((), dtype=dtype).element_size()
    assert spec.bytes_per_token == 2 * 2 * 2 * (8 * elem + (2 if elem == 1 else 0))
    assert (engine.scales is None) == (dtype == torch.float32)
    assert len(engine.layer_caches) == 2


def test_smollm2_capacity_int8_vs_fp32() -> None:
    """SmolLM2: 46080 bytes/token in fp32, 2 x 30 x 3 x (64 + 2) = 11880 in int8: 3.88x."""
    spec = KVCacheSpec(num_layers=30, num_kv_heads=3, head_dim=64, dtype=torch.int8,
                       block_size=16)
    fp32 = KVCacheSpec(num_layers=30, num_kv_heads=3, head_dim=64, dtype=torch.float32,
                       block_size=16)
    assert (fp32.bytes_per_token, spec.bytes_per_token) == (46080, 11880)
    budget = 2 * 2**30
    assert spec.num_blocks_for(budget) / fp32.num_blocks_for(budget) >= 3.8


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copy_blocks_copies_values_and_scales(dtype) -> None:
    engine = _engine(dtype)
    before = {b: _block(engine, b) for b in range(engine.num_blocks)}
    engine.copy_blocks([(1, 4), (2, 5)])
    for b in range(engine.num_blocks):
        want = before[{4: 1, 5: 2}.get(b, b)]
        assert all(torch.equal(x, y) for x, y in zip(_block(engine, b), want, strict=True))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swap_out_and_in_restores_values_and_scales(dtype) -> None:
    engine = _engine(dtype)
    saved = engine.swap_out([3, 0])
    assert [t.dtype for t in saved] == [p.dtype for p in engine.pools]
    originals = [_block(engine, 3), _block(engine, 0)]
    for pool in engine.pools:
        kv_quant.raw(pool).zero_()
    engine.swap_in([5, 1], saved)            # swapped back into other blocks
    assert all(torch.equal(x, y) for x, y in zip(_block(engine, 5), originals[0], strict=True))
    assert all(torch.equal(x, y) for x, y in zip(_block(engine, 1), originals[1], strict=True))
    with pytest.raises(ValueError, match="saved pools"):
        engine.swap_in([2], saved[:1] if len(saved) > 1 else [*saved, *saved])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swap_pool_round_trip_keeps_values_and_scales(dtype) -> None:
    """Blocks go to their own ids in a separate CPU pool of the same layout and come back
    into other device blocks bit for bit (scales included)."""
    engine = _engine(dtype, num_swap_blocks=3)
    assert [p.shape[2] for p in engine.swap_pools] == [3] * len(engine.pools)
    assert [p.dtype for p in engine.swap_pools] == [p.dtype for p in engine.pools]
    assert all(p.device.type == "cpu" for p in engine.swap_pools)
    assert all(s.data_ptr() != p.data_ptr()
               for s, p in zip(engine.swap_pools, engine.pools, strict=True))
    originals = {b: _block(engine, b) for b in (4, 1)}
    engine.swap_blocks_out([(4, 2), (1, 0)])
    for pool in engine.pools:
        kv_quant.raw(pool).zero_()
    engine.swap_blocks_in([(2, 5), (0, 3)])
    for dev, orig in ((5, 4), (3, 1)):
        assert all(torch.equal(x, y)
                   for x, y in zip(_block(engine, dev), originals[orig], strict=True))
    assert all(not kv_quant.raw(p)[:, :, 0].any() for p in engine.pools)  # untouched
    engine.swap_blocks_out([])                                            # no-ops
    engine.swap_blocks_in([])


def test_no_swap_pool_without_swap_blocks() -> None:
    assert _engine(torch.float32).swap_pools == []


def _vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(a, 16) for a in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_NOHUGEPAGE"),
                    reason="the platform has no madvise(MADV_NOHUGEPAGE)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.int8], ids=str)
def test_cpu_pool_is_zeroed_lazily_on_small_pages(dtype) -> None:
    """The CPU pool (and an 8-bit cache's scales) is zero, committed as written, and kept
    off transparent huge pages: a prefill's first write touches a few KiB in each layer's
    pool, and zeroing a 2 MiB huge page per layer for it made fresh prefills ~1.7x slower
    (cache_engine._zeros)."""
    spec = KVCacheSpec(num_layers=4, num_kv_heads=2, head_dim=64, dtype=dtype, block_size=16)
    engine = CacheEngine(spec, 4096, torch.device("cpu"))  # 8 MiB of values per layer part
    for pool in engine.pools:
        assert not kv_quant.raw(pool).any()
        for address in (pool.data_ptr(), pool.data_ptr() + pool.nbytes // 2):
            flags = _vm_flags(address)
            assert "nh" in flags and "hg" not in flags, flags
