"""GGUF block formats kept quantized: values equal gguf-py's, the kernel equals
dequantize-then-matmul (and, bit for bit, the dense fp32 packed kernel on the same values)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.quant import gguf as qg
from pagedllm.model.layers.quant.gguf import GGUFWeight, UnsupportedQuantTypeError

TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K]


def random_blocks(qtype: T, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Raw GGUF bytes [n, k / block * block_bytes]: gguf-py's quantizer where it has one, else
    random bytes with finite fp16 scales (every code and sub-scale pattern occurs)."""
    rng = np.random.default_rng(seed)
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    try:
        return quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)
    except NotImplementedError:
        pass
    raw = rng.integers(0, 256, (n, k // block, block_bytes), dtype=np.uint8)
    scale_offsets = {T.Q4_K: (0, 2), T.Q6_K: (208,)}[qtype]
    for off in scale_offsets:
        d = (rng.standard_normal(raw.shape[:2]) * 0.01).astype(np.float16)
        raw[..., off:off + 2] = d.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(n, -1)


def whole_k(qtype: T, k: int) -> int:
    """k rounded up to the format's whole blocks (Q4_K / Q6_K: 256-value super-blocks), so a
    test's shapes fit every format it runs over."""
    block = GGML_QUANT_SIZES[qtype][0]
    return -(-k // block) * block


@pytest.fixture(scope="module", autouse=True)
def _kernels():
    if not qg.available():
        pytest.fail("the GGUF CPU kernels did not build (cpu_ops.load() failed)")


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_equals_gguf_py(qtype):
    n, k = 45, 512  # 45 rows: a partial last panel
    raw = random_blocks(qtype, n, k)
    ref = dequantize(raw, qtype).reshape(n, k).astype(np.float32)
    w = GGUFWeight.from_blocks(qtype, raw, (n, k))
    assert w.shape == (n, k) and w.format == f"gguf:{qtype.name}"
    np.testing.assert_array_equal(w.dequantize().numpy().view(np.uint32), ref.view(np.uint32))
    ids = torch.tensor([44, 0, 7, 31, 32, 7])
    np.testing.assert_array_equal(w.embedding(ids).numpy(), ref[ids.numpy()])


@pytest.mark.parametrize("qtype", TYPES)
def test_row_order_permutes_rows(qtype):
    n, k = 40, 256
    raw = random_blocks(qtype, n, k, seed=1)
    ref = dequantize(raw, qtype).reshape(n, k)
    order = np.random.default_rng(2).permutation(n)
    w = GGUFWeight.from_blocks(qtype, raw, (n, k), row_order=order)
    np.testing.assert_array_equal(w.dequantize().numpy(), ref[order])


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 3, 8, 64, 300])
@pytest.mark.parametrize(("n", "k"), [(45, 256), (100, 768)])
def test_linear_equals_dequantize_then_matmul(qtype, m, n, k):
    # N = 45, 100 are not whole panels (16 or 32 columns); K is whole blocks by GGUF's
    # definition (K-types: 256) but 768 is not a multiple of 512 or of a micro-kernel tile.
    raw = random_blocks(qtype, n, k, seed=m)
    w = GGUFWeight.from_blocks(qtype, raw, (n, k))
    dense = torch.from_numpy(dequantize(raw, qtype).reshape(n, k).astype(np.float32))
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(n + m))
    out = w.linear(x)
    assert out.shape == (m, n)
    ref = x.double() @ dense.double().t()
    bound = 1e-6 * k ** 0.5 * (x.double().abs() @ dense.double().abs().t()) + 1e-6
    assert ((out.double() - ref).abs() <= bound).all()
    ops = cpu_ops.load()
    packed = ops.packed_linear(x, ops.pack_linear_weight(dense), n, None)
    assert torch.equal(out, packed), "quantized and dense packed kernels differ"


def test_both_kernel_paths_agree_for_every_row():
    # In-register dequant (few rows) and L2-scratch dequant (many rows) give the same bits, and
    # a row's result does not depend on the batch it is in.
    raw = random_blocks(T.Q4_1, 70, 512, seed=5)
    w = GGUFWeight.from_blocks(T.Q4_1, raw, (70, 512))
    x = torch.randn(20, 512)
    full = w.linear(x)
    for i in (0, 7, 19):
        assert torch.equal(w.linear(x[i:i + 1].contiguous())[0], full[i])


def test_concat_along_outputs():
    a = GGUFWeight.from_blocks(T.Q8_0, random_blocks(T.Q8_0, 64, 96, 1), (64, 96))
    b = GGUFWeight.from_blocks(T.Q8_0, random_blocks(T.Q8_0, 20, 96, 2), (20, 96))
    fused = GGUFWeight.concat([a, b])
    assert fused.shape == (84, 96)
    assert torch.equal(fused.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))


def test_unsupported_type_names_the_tensor():
    raw = np.zeros((4, 176), dtype=np.uint8)  # one Q5_K block per row
    with pytest.raises(UnsupportedQuantTypeError, match=r"blk\.0\.ffn_up\.weight.*Q5_K"):
        GGUFWeight.from_blocks(T.Q5_K, raw, (4, 256), name="blk.0.ffn_up.weight")


def test_truncated_blocks_are_refused():
    raw = random_blocks(T.Q4_0, 4, 64)[:, :-1]
    with pytest.raises(ValueError, match="bytes per row"):
        GGUFWeight.from_blocks(T.Q4_0, raw, (4, 64), name="x")
