"""The QuantizedWeight contract as the model sees it: a linear layer adopts one and runs its
kernel; fused projections are built from per-projection parts (same format: the format's own
concat; mixed formats: stacked). A minimal per-row int8 format written here exercises it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pagedllm.config import EngineConfig
from pagedllm.loader import load_checkpoint
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.quant import QuantizedWeight, StackedQuantizedWeight, concat_quantized
from pagedllm.worker import model_setup


class RowInt8(QuantizedWeight):
    """w[n, k] = scale[n] * q[n, k], q int8 (symmetric, per output row)."""

    format = "test-int8"

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__(*q.shape)
        self.q, self.scale = q, scale

    @classmethod
    def quantize(cls, w: torch.Tensor) -> RowInt8:
        scale = w.abs().amax(dim=1).clamp_min(1e-8) / 127
        return cls(torch.round(w / scale[:, None]).to(torch.int8), scale)

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.dequantize().t()

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.scale[:, None]

    @property
    def nbytes(self) -> int:
        return self.q.numel() + 4 * self.scale.numel()

    @classmethod
    def concat(cls, parts):
        return cls(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]))


class OtherRowInt8(RowInt8):
    format = "test-int8-other"


def test_linear_adopts_a_quantized_weight():
    torch.manual_seed(0)
    w = torch.randn(40, 24)
    layer = Linear(24, 40, bias=True)
    layer.bias.data.normal_()
    qw = RowInt8.quantize(w)
    layer.set_quantized(qw)
    layer.finalize()
    x = torch.randn(3, 5, 24)
    torch.testing.assert_close(layer(x), x @ qw.dequantize().t() + layer.bias)
    assert layer.weight.numel() == 0 and layer.weight_nbytes == qw.nbytes + 4 * 40
    with pytest.raises(ValueError, match="does not fit"):
        Linear(24, 41).set_quantized(qw)


def test_concat_same_format_uses_its_layout_and_mixed_formats_stack():
    torch.manual_seed(0)
    a, b = RowInt8.quantize(torch.randn(8, 16)), RowInt8.quantize(torch.randn(4, 16))
    fused = concat_quantized([a, b])
    assert type(fused) is RowInt8 and fused.shape == (12, 16)
    mixed = concat_quantized([a, OtherRowInt8.quantize(torch.randn(4, 16))])
    assert isinstance(mixed, StackedQuantizedWeight) and mixed.shape == (12, 16)
    x = torch.randn(3, 16)
    torch.testing.assert_close(mixed.linear(x), x @ mixed.dequantize().t())
    with pytest.raises(ValueError, match="in_features"):
        concat_quantized([a, RowInt8.quantize(torch.randn(4, 8))])


@pytest.mark.parametrize("mixed", [False, True])
def test_model_loads_quantized_linears(tiny_llama_dir, mixed):
    """Every linear loaded quantized (v projections in another format when `mixed`): the
    model's logits equal a dense model loaded with the dequantized weights."""
    ckpt = load_checkpoint(str(tiny_llama_dir))
    config = EngineConfig(model=str(tiny_llama_dir))
    config.finalize(1024)

    def quantized():
        for name, t in ckpt.weights():
            if t.dim() == 2 and "embed" not in name and "lm_head" not in name:
                fmt = OtherRowInt8 if mixed and "v_proj" in name else RowInt8
                yield name, fmt.quantize(t)
            else:
                yield name, t

    def dequantized():
        for name, t in quantized():
            yield name, t.dequantize() if isinstance(t, QuantizedWeight) else t

    q_model = model_setup.build_model(dataclasses.replace(ckpt, weights=quantized), config)
    d_model = model_setup.build_model(dataclasses.replace(ckpt, weights=dequantized), config)
    qkv = q_model.model.layers[0].self_attn.qkv_proj
    assert qkv.quant is not None and qkv.weight.numel() == 0
    assert isinstance(qkv.quant, StackedQuantizedWeight) == mixed
    for q_layer, d_layer in zip(q_model.model.layers, d_model.model.layers, strict=True):
        for attr in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj",
                     "mlp.down_proj"):
            q_lin, d_lin = q_layer.get_submodule(attr), d_layer.get_submodule(attr)
            xin = torch.randn(5, q_lin.in_features)
            torch.testing.assert_close(q_lin(xin), d_lin(xin), rtol=1e-5, atol=1e-4)
