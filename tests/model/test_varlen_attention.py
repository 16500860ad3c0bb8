"""Attention over packed sequences (varlen): the C++ kernel (kernels/varlen_attention_cpu.cpp)
and the per-sequence torch path equal torch SDPA run on each sequence alone, for mixed
lengths 1..1000 in one step, GQA, sliding windows, soft-capping, int8 / fp8 caches and
prefill chunks that continue a cached prefix; nothing depends on the other sequences of the
step or on how a sequence was split into chunks; greedy tokens equal HF's with a batch whose
prompt lengths differ by three orders of magnitude."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from pagedllm import SamplingParams
from pagedllm.kernels import cpu_ops
from pagedllm.model.layers import kv_quant
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.attention_backends.cpu import CPUBackend
from pagedllm.model.layers.attention_backends.torch_ref import TorchBackend

PATHS = ["kernel", "torch"]


def _backend(path: str):
    """The C++ CPU backend (its varlen kernel; skipped on a CPU without one) or torch's."""
    if path == "torch":
        return TorchBackend("cpu")
    if cpu_ops.load_with("varlen_attention") is None:
        pytest.skip("this CPU has no AVX2+FMA+F16C / AVX-512: no varlen kernel")
    return CPUBackend("cpu")


def _layout(ctx: list[int], new: list[int], block_size: int, kvh: int, d: int,
            dtype: torch.dtype | None, seed: int = 0):
    """Pools holding each sequence's keys at shuffled blocks, its block table, the K/V of its
    new tokens and the reference K/V (the dequantized values for an 8-bit cache). The new
    tokens' rows are the original values already stored at their slots: writing them puts back
    (re-quantizes to) exactly what is there."""
    gen = torch.Generator().manual_seed(seed)
    lens = [c + n for c, n in zip(ctx, new, strict=True)]
    blocks = [-(-n // block_size) for n in lens]
    nblocks = sum(blocks) + 2
    order = torch.randperm(nblocks, generator=gen).tolist()
    tables = torch.zeros(len(lens), max(blocks), dtype=torch.long)
    for i, nb in enumerate(blocks):
        tables[i, :nb] = torch.tensor([order.pop() for _ in range(nb)])
    pools, refs, scales, originals = [], [], [], []
    for _ in range(2):
        x = torch.randn(nblocks, block_size, kvh, d, generator=gen)
        originals.append(x)
        if dtype is None:
            pools.append(x)
            refs.append(x)
            scales.append(None)
        else:
            values, s = kv_quant.quantize(x, dtype)
            pools.append(values)
            refs.append(kv_quant.dequantize(values, s, torch.float32))
            scales.append(s)
    slots = torch.tensor([int(tables[i, p // block_size]) * block_size + p % block_size
                          for i, (c, n) in enumerate(zip(ctx, new, strict=True))
                          for p in range(c, c + n)], dtype=torch.long)
    new_kv = [x.view(-1, kvh, d)[slots].clone() for x in originals]
    return lens, tables, pools, scales, refs, slots, new_kv


def _reference(q, refs, tables, ctx, new, block_size, scale, window, softcap):
    """torch SDPA (or the soft-capped formula) on each sequence alone."""
    out = torch.empty_like(q)
    row = 0
    h, d = q.shape[1:]
    for i, (c, n) in enumerate(zip(ctx, new, strict=True)):
        length = c + n
        pos = torch.arange(length)
        flat = tables[i, pos // block_size] * block_size + pos % block_size
        k, v = (r.view(-1, *r.shape[2:])[flat] for r in refs)            # [L, kvh, d]
        g = h // k.shape[1]
        k = k.repeat_interleave(g, 1).transpose(0, 1)
        v = v.repeat_interleave(g, 1).transpose(0, 1)
        qs = q[row:row + n].transpose(0, 1)                                # [H, n, d]
        q_pos = torch.arange(c, length)[:, None]
        mask = pos[None, :] <= q_pos
        if window:
            mask &= pos[None, :] > q_pos - window
        if softcap:
            s = (qs.double() @ k.double().transpose(1, 2)) * scale
            s = (torch.tanh(s / softcap) * softcap).masked_fill(~mask, float("-inf"))
            o = (s.softmax(-1) @ v.double()).float()
        else:
            o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale)
        out[row:row + n] = o.transpose(0, 1)
        row += n
    return out


def _run(backend, ctx, new, *, h=6, kvh=2, d=64, block_size=16, window=None, softcap=None,
         dtype=None, seed=0, decodes=0):
    """`backend` over `decodes` single-token sequences (the decode path) followed by
    prefill chunks `new` after `ctx` cached tokens; returns (output, reference)."""
    all_ctx = [5 + 3 * i for i in range(decodes)] + ctx
    all_new = [1] * decodes + new
    lens, tables, pools, scales, refs, slots, (k_new, v_new) = _layout(
        all_ctx, all_new, block_size, kvh, d, dtype, seed)
    t = sum(all_new)
    gen = torch.Generator().manual_seed(seed + 1)
    qkv = torch.randn(t, (h + 2 * kvh) * d, generator=gen)  # q as a strided view, as models do
    q = qkv[:, :h * d].view(t, h, d)
    p_new = torch.tensor(new)
    meta = AttentionMetadata(
        slot_mapping=slots, num_decodes=decodes,
        decode_block_tables=tables[:decodes] if decodes else None,
        decode_seq_lens=torch.tensor(lens[:decodes]) if decodes else None,
        sliding_window=window, prefill_block_tables=tables[decodes:],
        prefill_query_start=torch.cat([torch.zeros(1, dtype=torch.long), p_new.cumsum(0)]),
        prefill_seq_lens=torch.tensor(lens[decodes:]))
    scale = d ** -0.5
    kv = LayerKVCache(pools[0], pools[1], scales[0], scales[1])
    out = backend.forward(q, k_new, v_new, kv, meta, scale, softcap).view(t, h, d)
    return out, _reference(q, refs, tables, all_ctx, all_new, block_size, scale, window,
                           softcap)


@pytest.mark.parametrize("path", PATHS)
def test_mixed_lengths_one_step(path) -> None:
    """One step of prompts from 1 to 1000 tokens, some continuing a cached prefix, and two
    decodes in front (the mixed prefill + decode step)."""
    new = [1, 5, 1000, 17, 2, 64, 333]
    ctx = [0, 0, 0, 40, 7, 100, 16]
    out, ref = _run(_backend(path), ctx, new, decodes=2, h=9, kvh=3)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("h", "kvh", "d", "block_size"),
                         [(4, 4, 32, 8), (8, 2, 128, 16), (4, 1, 256, 32), (12, 4, 16, 64)])
def test_head_layouts_and_block_sizes(path, h, kvh, d, block_size) -> None:
    """GQA from 1 to 4 query heads per KV head, head sizes 16..256 (Gemma 3: 256)."""
    out, ref = _run(_backend(path), [0, 30, 3], [77, 19, 40], h=h, kvh=kvh, d=d,
                    block_size=block_size)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("window", [1, 7, 24, 512])
def test_sliding_window(path, window) -> None:
    out, ref = _run(_backend(path), [0, 50, 0], [600, 31, 9], window=window, decodes=1)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("path", PATHS)
def test_softcap(path) -> None:
    """Gemma-style logit soft-capping: scores -> tanh(scores / cap) * cap."""
    out, ref = _run(_backend(path), [0, 20], [50, 13], softcap=2.0, window=32)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.int8, torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=str)
def test_quantized_cache(path, dtype) -> None:
    """Attention over an 8-bit cache equals attention over its dequantized values."""
    out, ref = _run(_backend(path), [0, 33, 0], [70, 12, 1], dtype=dtype, decodes=1)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)


def chunked_rows(scope: Callable[[int], contextlib.AbstractContextManager] | None = None):
    """A 300-token prompt's attention rows (window 48) computed in one chunk, and in two:
    rows 0..136, then 137..299 after a cached prefix behind 29 rows of another sequence.
    `scope(rows)`, if given, is entered around each step of that many rows."""
    backend = _backend("kernel")
    lens, tables, pools, _, refs, slots, (k_new, v_new) = _layout([0], [300], 16, 2, 64, None)
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(300, 6, 64, generator=gen)

    def step(start: int, stop: int, neighbour: int = 0):
        """Rows start..stop-1 of the sequence, after `neighbour` rows of another one."""
        other = torch.randn(neighbour, 6, 64, generator=gen)
        n = stop - start
        meta = AttentionMetadata(
            slot_mapping=torch.cat([slots[:neighbour], slots[start:stop]]), num_decodes=0,
            decode_block_tables=None, decode_seq_lens=None, sliding_window=48,
            prefill_block_tables=tables.expand(2, -1).contiguous(),
            prefill_query_start=torch.tensor([0, neighbour, neighbour + n]),
            prefill_seq_lens=torch.tensor([max(neighbour, 1), stop]))
        with scope(neighbour + n) if scope else contextlib.nullcontext():
            out = backend.forward(torch.cat([other, q[start:stop]]),
                                  torch.cat([k_new[:neighbour], k_new[start:stop]]),
                                  torch.cat([v_new[:neighbour], v_new[start:stop]]),
                                  LayerKVCache(pools[0], pools[1]), meta, 0.125)
        return out.view(neighbour + n, 6, 64)[neighbour:]

    return step(0, 300), torch.cat([step(0, 137), step(137, 300, neighbour=29)])


def test_rows_do_not_depend_on_chunking_or_neighbours() -> None:
    """A query row's output is bit-identical whether its prompt runs in one chunk or after a
    cached prefix in another, and whatever else is in the step (batch invariance)."""
    one, two = chunked_rows()
    assert torch.equal(one, two)


def test_rows_do_not_depend_on_the_thread_count() -> None:
    """Work items go out costliest first to whichever thread is free: a mixed step (a long
    prompt's late tiles, short prompts, a windowed one) gives the same bits on 1, 2 and 3
    threads."""
    backend = _backend("kernel")
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(torch.cat([
                _run(backend, [0, 9, 0, 200], [513, 40, 3, 70], h=9, kvh=3)[0],
                _run(backend, [0, 30], [400, 20], window=100, h=9, kvh=3)[0]]))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_greedy_matches_hf_with_lengths_1_to_1000(tiny_llama_dir, make_llm,
                                                  hf_reference) -> None:
    """A batch whose prompts run from 1 to 1000 tokens, all prefilled in one step, and the
    same with chunked prefill: greedy tokens equal HF's for every prompt."""
    rng = random.Random(5)
    prompts = [[rng.randrange(2, 512) for _ in range(n)] for n in (1, 1000, 5, 5, 250, 33)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for engine_args in ({"max_num_batched_tokens": 2048}, {"max_num_batched_tokens": 96}):
        llm = make_llm(tiny_llama_dir, **engine_args)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                            use_tqdm=False)
        for prompt, out in zip(prompts, outs, strict=True):
            expected, _ = hf_reference.greedy(tiny_llama_dir, prompt, 12)
            assert out.outputs[0].token_ids == expected, f"prompt of {len(prompt)} tokens"
