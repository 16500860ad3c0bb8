"""Kernels whose threads take each other's remaining work (kernels/balanced_for_cpu.h): every
weight format's linear (fp32 panels, bf16, exact GGUF, GGUF rows with int8 activations, the
int8 panels and their fused MLP, int8 / int4 / W8A8), the prompt tiles' GEMM and MLP, and the
decode attention give the bits of one thread whatever the threads and however the items end
up among them. 3 threads split the items unevenly; 4 threads on this machine's 2 cores run in
turns, so a thread finishes its share while another is off its core and takes that one's
remaining items (the case the stealing is for)."""

from __future__ import annotations

import gguf
import pytest
import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.attention import AttentionMetadata, LayerKVCache
from pagedllm.model.layers.attention_backends.cpu import CPUBackend
from pagedllm.model.layers.quant import gguf as gguf_weights
from pagedllm.model.layers.quant.bf16 import Bf16Weight
from pagedllm.model.layers.quant.dense import dense_method
from pagedllm.model.layers.quant.gguf_a8_panels import GGUFA8PanelWeight
from pagedllm.model.layers.quant.int4 import Int4GroupWeight
from pagedllm.model.layers.quant.int8 import Int8Weight
from tests.model.quant.test_gguf_formats import random_blocks
from tests.model.quant.test_prompt_tiles import bf16_linear, bf16_mlp, prompt_tiles
from tests.model.test_attention import _tables

THREADS = (3, 4)
REPEATS = 4


def _same_on_any_threads(run) -> None:
    """run() on 1 thread, then REPEATS times on each of THREADS: the same bits each time."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        want = run()
        for threads in THREADS:
            torch.set_num_threads(threads)
            for i in range(REPEATS):
                got = run()
                assert torch.equal(got, want), f"{threads} threads, run {i}"
    finally:
        torch.set_num_threads(before)


def _panels(qtype, n: int, k: int, seed: int) -> GGUFA8PanelWeight:
    return GGUFA8PanelWeight.from_blocks(qtype, random_blocks(qtype, n, k, seed=seed), (n, k))


def _formats(n: int, k: int) -> dict:
    """Each format's [n, k] weight as its LinearMethod (each split over its panels / blocks of
    output columns)."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(10))
    g = torch.Generator().manual_seed(11)
    q4, z4 = torch.randint(0, 16, (n, k), generator=g), torch.randint(0, 16, (n, 2), generator=g)
    s4 = torch.rand(n, 2, generator=g) * 0.1
    kernels = cpu_ops.load()
    if kernels is None or not gguf_weights.available() or cpu_ops.load_with("a8_panels") is None:
        pytest.fail("the CPU kernels did not build")
    q4_k = gguf.GGMLQuantizationType.Q4_K
    return {"fp32": dense_method(w, keep_dense=False), "bf16": Bf16Weight(kernels, w, 10 ** 6),
            "int8": Int8Weight.quantize(w), "w8a8": Int8Weight.quantize(w, w8a8=True),
            "int4": Int4GroupWeight(q4, z4, s4, k // 2),
            "gguf_q4_k": gguf_weights.GGUFWeight.from_blocks(q4_k, random_blocks(q4_k, n, k), (n, k)),
            "a8_panels_q4_k": GGUFA8PanelWeight.from_blocks(q4_k, random_blocks(q4_k, n, k), (n, k))}


@pytest.mark.parametrize("rows", [1, 64, 300])
def test_every_format(rows):
    """700 output columns (many panels, a partial last one), 1 / 64 / 300 rows."""
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
    for name, method in _formats(700, 256).items():
        try:
            _same_on_any_threads(lambda m=method: m.apply(x, None))
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from e


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("rows", [64, 600])
def test_int8_panels(ops, qtype, rows):
    """64 rows (a decode batch: the threads split 97 panels, N past a whole panel) and 600
    (a prompt: on 3 and 4 threads the threads split the rows, 32-row items, the last one
    partial) through a8_panel_linear, and a fused MLP of 48 blocks through a8_panel_mlp."""
    qt = gguf.GGMLQuantizationType[qtype]
    w = _panels(qt, 3090, 256, seed=1)
    gu, down = _panels(qt, 2 * 1536, 256, seed=2), _panels(qt, 200, 1536, seed=3)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(4)) * 3
    _same_on_any_threads(lambda: w.linear(x))
    _same_on_any_threads(lambda: gu.gated_mlp(down, x))


@pytest.mark.parametrize("mode", ["emulated", "amx"])
def test_prompt_tiles_rows(ops, mode):
    """300 rows at K = 1,536 (three chunks of rows a panel: units of (panel, chunk)), 5
    panels, the matrix's tiles dequantized per call or kept; the MLP (gate/up pairs, then
    the down projection) the same way."""
    qt = gguf.GGMLQuantizationType.Q4_1
    w = _panels(qt, 150, 1536, seed=5)
    gu, down = _panels(qt, 2 * 96, 1536, seed=6), _panels(qt, 70, 96, seed=7)
    x = torch.randn(300, 1536, generator=torch.Generator().manual_seed(8))
    with prompt_tiles(ops, mode):
        for kept in (False, True):
            if kept:
                for m in (w, gu, down):
                    m.keep_bf16_tiles()
            _same_on_any_threads(lambda: bf16_linear(ops, x, w))
            _same_on_any_threads(lambda: bf16_mlp(ops, x, gu, down))


@pytest.mark.parametrize("mode", ["emulated", "amx"])
def test_prompt_tiles_row_split(ops, mode):
    """Kept tiles and 1,040 rows: on 3 and 4 threads (at least 192 rows a thread) the
    threads split the rows, not the panels (kRowSplitRows): 288 rows a thread on 4 threads,
    the last thread 176, each thread's rows in chunks; the GEMM and the MLP give one
    thread's bits."""
    qt = gguf.GGMLQuantizationType.Q4_1
    w = _panels(qt, 70, 256, seed=15)
    gu, down = _panels(qt, 2 * 64, 256, seed=16), _panels(qt, 40, 64, seed=17)
    for m in (w, gu, down):
        m.keep_bf16_tiles()
    x = torch.randn(1040, 256, generator=torch.Generator().manual_seed(18))
    with prompt_tiles(ops, mode):
        _same_on_any_threads(lambda: bf16_linear(ops, x, w))
        _same_on_any_threads(lambda: bf16_mlp(ops, x, gu, down))


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_decode_attention_sequences(kv_dtype):
    """A decode step of 40 sequences of 1 to 300 tokens (a sequence an item)."""
    if cpu_ops.load() is None:
        pytest.fail("the CPU kernels did not build")
    backend = CPUBackend("cpu")
    heads, kv_heads, d, bs, nblocks = 9, 3, 64, 16, 800
    gen = torch.Generator().manual_seed(9)
    lens = [1 + (37 * i) % 300 for i in range(40)]
    bt = _tables(lens, bs, nblocks)
    slots = torch.tensor([int(bt[i, (n - 1) // bs]) * bs + (n - 1) % bs
                          for i, n in enumerate(lens)])
    pools = [(torch.randn(nblocks, bs, kv_heads, d, generator=gen) * 2).to(kv_dtype)
             for _ in range(2)]
    q = torch.randn(len(lens), heads, d, generator=gen)
    k, v = (torch.randn(len(lens), kv_heads, d, generator=gen) for _ in range(2))
    meta = AttentionMetadata(
        slot_mapping=slots, num_decodes=len(lens), decode_block_tables=bt,
        decode_seq_lens=torch.tensor(lens), sliding_window=None, prefill_block_tables=None)

    def run():
        cache = LayerKVCache(pools[0].clone(), pools[1].clone(), None, None)
        return backend.forward(q, k, v, cache, meta, d ** -0.5)

    _same_on_any_threads(run)
