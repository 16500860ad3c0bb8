"""`GGUFMatrix`: a tensor-parallel rank's rows and block columns cut from the file's bytes
build the same values as cutting the whole matrix's dequantized values (exactly)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from pagedllm.model.layers.quant import gguf
from pagedllm.model.layers.quant.gguf_matrix import GGUFMatrix
from tests.model.quant.test_gguf_formats import random_blocks

pytestmark = pytest.mark.skipif(not gguf.available(), reason="GGUF CPU kernels not built")
N, K = 48, 512


@pytest.mark.parametrize("a8", [False, True])
@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K])
def test_rows_and_columns_cut_the_file_bytes(qtype, a8) -> None:
    raw = random_blocks(qtype, N, K, seed=3)
    order = np.random.default_rng(0).permutation(N)  # a loader's q/k row order
    whole = GGUFMatrix.of(qtype, raw, (N, K), "m", order, a8)
    ref = gguf.GGUFWeight.from_blocks(qtype, raw, (N, K), row_order=order).dequantize()
    torch.testing.assert_close(whole.build().dequantize(), ref, rtol=0, atol=0)
    rows = np.array([5, 0, 47, -1, 9, -1])  # -1: vocabulary padding, zero rows
    part = whole.rows(rows).build().dequantize()
    assert part.shape == (6, K)
    torch.testing.assert_close(part[[0, 1, 2, 4]], ref[[5, 0, 47, 9]], rtol=0, atol=0)
    assert not part[[3, 5]].any()
    cols = whole.cols(256, 512).build().dequantize()
    torch.testing.assert_close(cols, ref[:, 256:512], rtol=0, atol=0)
    both = whole.rows(np.arange(16, 32)).cols(0, 256)
    assert both.shape == (16, 256)
    torch.testing.assert_close(both.build().dequantize(), ref[16:32, :256], rtol=0, atol=0)


def test_a_cut_inside_a_block_names_the_matrix() -> None:
    m = GGUFMatrix.of(T.Q4_K, random_blocks(T.Q4_K, N, K), (N, K), "blk.0.attn_output", None,
                      False)
    with pytest.raises(ValueError, match=r"blk.0.attn_output.*Q4_K.*\[0, 192\).*256"):
        m.cols(0, 192)
    m.cols(0, 256)  # whole super-blocks split
