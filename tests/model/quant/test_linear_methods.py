"""Every weight format as a `LinearMethod`: the layer calls `apply`, reads `nbytes` and asks
`fused_ref` for the C++ decode loop, and never asks which format it holds."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as T

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.parallel import tensor_parallel_layers
from pagedllm.model.layers.quant import LinearMethod, concat_quantized, gguf, gguf_a8_panels
from pagedllm.model.layers.quant.dense import DenseWeight, TransposedWeight, dense_method
from pagedllm.model.layers.quant.int4 import Int4GroupWeight
from pagedllm.model.layers.quant.int8 import Int8Weight
from tests.model.quant.test_gguf_formats import random_blocks

ops = cpu_ops.load()
needs_decode_loop = pytest.mark.skipif(ops is None or not hasattr(ops, "decode_layers"),
                                       reason="C++ decode loop unavailable")
N, K = 40, 64


class _OneRank:
    """Collectives of a group of one: what a row-parallel layer does on a single rank."""

    def all_reduce(self, out: torch.Tensor) -> torch.Tensor:
        return out

    def gather_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def embed(self, lookup, ids: torch.Tensor, rows: int) -> torch.Tensor:
        return lookup(ids)


def _formats() -> dict[str, LinearMethod]:
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    q4, z4 = torch.randint(0, 16, (N, K), generator=g), torch.randint(0, 16, (N, 2), generator=g)
    s4 = torch.rand(N, 2, generator=g) * 0.1
    out = {"dense": DenseWeight(w), "transposed": TransposedWeight(w),
           "int8": Int8Weight.quantize(w), "w8a8": Int8Weight.quantize(w, w8a8=True),
           "int4": Int4GroupWeight(q4, z4, s4, K // 2),
           "int4-act-order": Int4GroupWeight(q4, z4, s4, K // 2, torch.randperm(K, generator=g))}
    if ops is not None:
        out["packed"] = dense_method(w, keep_dense=False)
    if gguf.available():
        blocks = random_blocks(T.Q4_1, N, K)
        out["gguf"] = gguf.GGUFWeight.from_blocks(T.Q4_1, blocks, (N, K))
        out["stacked"] = concat_quantized([out["gguf"], Int8Weight.quantize(w)])
    if gguf_a8_panels.kernels() is not None:
        out["a8_panels"] = gguf_a8_panels.GGUFA8PanelWeight.from_blocks(
            T.Q8_0, random_blocks(T.Q8_0, N, K), (N, K))
        out["a8_panels_q4_k"] = gguf_a8_panels.GGUFA8PanelWeight.from_blocks(
            T.Q4_K, random_blocks(T.Q4_K, N, 256), (N, 256))
    return out


FORMATS = _formats()


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_linear_runs_its_method(name: str) -> None:
    """The layer's output is the method's `apply`, leading dims and bias included."""
    method = FORMATS[name]
    n, k = method.shape
    layer = Linear(k, n, bias=True)
    layer.bias.data.normal_()
    layer.method = method
    x = torch.randn(2, 3, k)
    torch.testing.assert_close(layer(x), method.apply(x, layer.bias))
    assert layer.weight_nbytes == method.nbytes + 4 * n
    assert method.nbytes > 0


@needs_decode_loop
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_fused_ref_is_the_formats_own(name: str) -> None:
    """Formats with a C++ kernel in the decode loop give a `LinearRef` computing what
    `apply` computes (int8 / W8A8 / int4: the int module's kernels by address); the others
    (and any layer with a tensor-parallel collective) give None."""
    method = FORMATS[name]
    n, k = method.shape
    layer = Linear(k, n, bias=True)
    layer.bias.data.normal_()
    layer.method = method
    ref = layer.fused_ref(ops)
    if name in ("dense", "transposed", "stacked", "int4-act-order"):
        assert ref is None
        return
    assert ref is not None
    x = torch.randn(3, k)
    torch.testing.assert_close(ref(x), layer(x), rtol=0, atol=0)
    with tensor_parallel_layers(_OneRank()):
        row_parallel = Linear(k, n, bias=True, combine="sum")
    row_parallel.bias.data.copy_(layer.bias)
    row_parallel.method = method
    assert row_parallel.fused_ref(ops) is None
    torch.testing.assert_close(row_parallel(x), layer(x), rtol=0, atol=0)


def test_finalize_picks_the_dense_layout_once() -> None:
    w = torch.randn(N, K)
    layer = Linear(K, N)
    layer.weight.data.copy_(w)
    layer.finalize()
    method = layer.method
    assert method.format.startswith("dense") and not method.uses_layer_weight
    assert layer.quant is method and layer.weight.numel() == 0
    layer.finalize()  # a second call keeps the layout
    assert layer.method is method
    torch.testing.assert_close(layer(torch.eye(K)).t(), w, rtol=1e-6, atol=1e-6)
    training = Linear(K, N)
    training.keep_dense = True
    training.weight.data.copy_(w)
    training.finalize()
    assert training.method.format == "dense" and training.quant is None
    x = torch.randn(2, K)
    torch.testing.assert_close(training(x), F.linear(x, w))
