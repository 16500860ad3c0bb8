"""NF4 against bitsandbytes (the reference implementation, CPU backend): the table, the
packed codes and dequantized values; the double-quantized round-trip error bound; the
forward/backward of an NF4 linear; a QLoRA run whose loss falls."""

from __future__ import annotations

import bitsandbytes.functional as bnb
import torch

from pagedllm.finetune import Trainer
from pagedllm.finetune.nf4 import (
    BLOCK,
    DYNAMIC_MAP,
    NF4_TABLE,
    NF4Weight,
    dequantize_nf4,
    quantize_nf4,
)

# Largest gap between neighbouring NF4 values (0.7230 .. 1.0): a weight is at most half of
# it (times its block's absmax) from its code.
HALF_GAP = float((NF4_TABLE[1:] - NF4_TABLE[:-1]).max() / 2)


def _weight(seed: int = 0, shape=(96, 256)) -> torch.Tensor:
    w = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    w[3, :64] *= 20  # one block with a much larger absmax
    return w


def test_table_is_bitsandbytes_nf4() -> None:
    ref = bnb.get_4bit_type("nf4", device="cpu")
    torch.testing.assert_close(NF4_TABLE, ref.float(), atol=0, rtol=0)


def test_codes_and_values_equal_bitsandbytes() -> None:
    w = _weight()
    packed, absmax = quantize_nf4(w)
    q, state = bnb.quantize_4bit(w, blocksize=BLOCK, quant_type="nf4", compress_statistics=False)
    assert torch.equal(packed, q.flatten())
    torch.testing.assert_close(absmax, state.absmax, atol=0, rtol=0)
    torch.testing.assert_close(dequantize_nf4(packed, absmax).view_as(w),
                               bnb.dequantize_4bit(q, state), atol=0, rtol=0)


def test_double_quantized_round_trip_bound() -> None:
    w = _weight(1)
    qw = NF4Weight(w)
    _, absmax = quantize_nf4(w)
    scale_err = (qw.absmax() - absmax).abs()
    assert float((scale_err / absmax).max()) < 0.05  # 8-bit dynamic code of the scales
    blocks = w.view(-1, BLOCK)
    err = (qw.dequantize().view(-1, BLOCK) - blocks).abs()
    bound = absmax[:, None] * HALF_GAP + scale_err[:, None] + 1e-6
    assert bool((err <= bound).all())
    # bitsandbytes' double quantization: the same 8-bit map and blocks of 256; its codes
    # (nearest value, searched its own way) differ from ours by at most one step, rarely.
    q, state = bnb.quantize_4bit(w, blocksize=BLOCK, quant_type="nf4", compress_statistics=True)
    torch.testing.assert_close(DYNAMIC_MAP, state.state2.code.float(), atol=0, rtol=0)
    torch.testing.assert_close(qw.scale_scale, state.state2.absmax, atol=0, rtol=0)
    step = (qw.scale_codes.int() - state.absmax.int()).abs()
    assert int(step.max()) <= 1 and float((step == 0).float().mean()) > 0.9
    ref_err = (bnb.dequantize_4bit(q, state) - w).abs().mean()
    assert float(err.mean()) <= 1.01 * float(ref_err)
    assert qw.nbytes < w.numel() * 4 / 7.5  # ~0.52 bytes per weight


def test_nf4_linear_forward_backward() -> None:
    w = _weight(2)
    qw = NF4Weight(w)
    x = torch.randn(5, 256, requires_grad=True)
    y = qw.linear(x)
    dense = qw.dequantize()
    torch.testing.assert_close(y, x @ dense.t())
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(5, 96) @ dense)


def test_qlora_loss_falls(ft_config) -> None:
    trainer = Trainer(ft_config(qlora=True, target_modules="all-linear"))
    linears = [m for n, m in trainer.model.named_modules()  # wrapped by their LoRALinear
               if n.endswith(("qkv_proj.base_layer", "down_proj.base_layer"))]
    assert linears and all(isinstance(m.method, NF4Weight) for m in linears)
    dense_bytes = sum(4 * m.in_features * m.out_features for m in linears)
    assert sum(m.method.nbytes for m in linears) < dense_bytes / 7
    result = trainer.train()
    assert result.losses[-1] < result.losses[0] / 3, result.losses
