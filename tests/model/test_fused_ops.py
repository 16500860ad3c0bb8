"""Fused fp32 CPU ops (kernels/fused_cpu.cpp) against the torch formulas they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.activation import gelu_tanh_and_mul, silu_and_mul
from pagedllm.model.layers.norm import GemmaRMSNorm, RMSNorm, head_norms_
from pagedllm.model.layers.rotary import RopeBatch, RotaryEmbedding

ops = cpu_ops.load()
pytestmark = pytest.mark.skipif(ops is None, reason="C++ CPU kernels unavailable")


def _norm(hidden: int, seed: int) -> RMSNorm:
    norm = RMSNorm(hidden, 1e-5)
    norm.weight.data = torch.randn(hidden, generator=torch.Generator().manual_seed(seed))
    return norm


def _torch_norm(norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor | None):
    """The torch path of RMSNorm.forward (what runs on other devices)."""
    if residual is not None:
        x = x + residual
    var = x.pow(2).mean(-1, keepdim=True)
    return norm.weight * (x * torch.rsqrt(var + norm.eps)), x


@pytest.mark.parametrize("rows", [1, 3, 64, 200])
@pytest.mark.parametrize("hidden", [576, 100])
def test_rms_norm_and_fused_residual_add(rows, hidden):
    norm = _norm(hidden, rows)
    x, res = torch.randn(rows, hidden), torch.randn(rows, hidden)
    want_out, want_sum = _torch_norm(norm, x, res)
    out, summed = norm(x.clone(), res.clone())
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(summed, want_sum, rtol=0, atol=0)
    out, same = norm(x, None)
    assert same is x
    torch.testing.assert_close(out, _torch_norm(norm, x, None)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 3, 64])
@pytest.mark.parametrize("hidden", [640, 256])
def test_gemma_norm_equals_hf_gemma3_norm(rows, hidden):
    """GemmaRMSNorm's C++ path (times 1 + weight) against transformers' Gemma3RMSNorm."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    weight = torch.randn(hidden, generator=torch.Generator().manual_seed(rows)) * 0.5
    ours, hf = GemmaRMSNorm(hidden, 1e-6), Gemma3RMSNorm(hidden, 1e-6)
    ours.weight.data, hf.weight.data = weight.clone(), weight.clone()
    x, res = torch.randn(rows, hidden), torch.randn(rows, hidden)
    calls = []
    with pytest.MonkeyPatch.context() as mp:  # the C++ op must be what ran
        mp.setattr(cpu_ops, "fp32_ops", lambda t, family="core": _Counting(ops, calls))
        out, summed = ours(x.clone(), res.clone())
        alone, same = ours(x, None)
    assert calls == ["add_rms_norm_", "rms_norm"]
    with torch.no_grad():
        torch.testing.assert_close(out, hf(x + res), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(alone, hf(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(summed, x + res, rtol=0, atol=0)
    assert same is x


class _Counting:
    """The kernels module, recording which norm ops are called."""

    def __init__(self, module, calls: list[str]) -> None:
        self.module, self.calls = module, calls

    def __getattr__(self, name: str):
        self.calls.append(name)
        return getattr(self.module, name)


@pytest.mark.parametrize("kind", [RMSNorm, GemmaRMSNorm])
@pytest.mark.parametrize(("rows", "heads", "kv_heads", "head_dim"),
                         [(1, 4, 1, 256), (5, 16, 8, 128), (64, 9, 3, 64)])
def test_head_norms_in_one_call_equal_the_norm_modules(kind, rows, heads, kv_heads, head_dim):
    """Qwen3 / Gemma 3 q and k head norms: the one C++ call gives each head row the bits the
    norm module gives it (its C++ path over the heads' rows), v untouched."""
    gen = torch.Generator().manual_seed(rows)
    q_norm, k_norm = kind(head_dim, 1e-6), kind(head_dim, 1e-6)
    q_norm.weight.data = torch.randn(head_dim, generator=gen)
    k_norm.weight.data = torch.randn(head_dim, generator=gen)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim, generator=gen)
    got = qkv.clone()
    head_norms_(got, q_norm, k_norm, heads, kv_heads, head_dim)
    split = qkv.view(rows, -1, head_dim)
    want = torch.cat([q_norm(split[:, :heads].reshape(-1, head_dim).contiguous())[0]
                      .view(rows, heads, head_dim),
                      k_norm(split[:, heads:heads + kv_heads].reshape(-1, head_dim).contiguous())
                      [0].view(rows, kv_heads, head_dim),
                      split[:, heads + kv_heads:]], dim=1).view(rows, -1)
    assert torch.equal(got, want)


@pytest.mark.parametrize("rows", [1, 7, 64])
def test_silu_and_mul(rows, monkeypatch):
    gu = torch.randn(rows, 2 * 96) * 4
    want = F.silu(gu[:, :96]) * gu[:, 96:]
    torch.testing.assert_close(silu_and_mul(gu), want, rtol=1e-5, atol=1e-6)
    monkeypatch.setattr(cpu_ops, "load", lambda family="core": None)
    torch.testing.assert_close(silu_and_mul(gu), want, rtol=0, atol=0)


def test_silu_and_mul_of_large_gates():
    """Gates far past e^x's fp32 range (|g| up to 1e4: outlier channels) give silu's values,
    never NaN (the kernel's e^-g overflowed to inf under -ffast-math below -88)."""
    gates = torch.cat([torch.linspace(-1e4, 1e4, 2001), torch.tensor([-89.0, -88.0, -87.0])])
    gu = torch.cat([gates, torch.linspace(-3, 3, gates.numel())]).reshape(1, -1)
    got = silu_and_mul(gu)
    assert not got.isnan().any()
    want = F.silu(gates.double()) * gu[0, gates.numel():].double()
    torch.testing.assert_close(got[0].double(), want, rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize("rows", [1, 5, 64])
def test_gelu_tanh_and_mul_equals_torch(rows):
    """Gemma's gated GELU (tanh form) in one C++ call against torch's ops, over ordinary
    gates and gates far out (|g| up to 1e20, whose cube overflows fp32): finite, torch's
    values."""
    gen = torch.Generator().manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 2048, generator=gen) * 3
    gate_up[0, :8] = torch.tensor([-1e20, -1e4, -30.0, -20.0, 20.0, 30.0, 1e4, 1e20])
    got = gelu_tanh_and_mul(gate_up)
    gate, up = gate_up.chunk(2, -1)
    want = F.gelu(gate, approximate="tanh") * up  # fp32, as HF computes it
    assert got.isfinite().all()
    # 1 + tanh cancels for negative gates in fp32 either way: a tanh ulp there is ~1e-6 out
    torch.testing.assert_close(got, want, rtol=1e-5, atol=4e-6)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "rot"),
                         [(9, 3, 64, 64), (4, 4, 32, 32), (4, 2, 64, 32)])
def test_rotary_matches_torch_rotation(heads, kv_heads, head_dim, rot):
    """In-place q/k rotation of fused qkv rows (full and partial rotary); v untouched."""
    rotary = RotaryEmbedding(head_dim, {"rope_type": "default", "rope_theta": 10000.0,
                                        "partial_rotary_factor": rot / head_dim}, 4096)
    assert rotary.rotary_dim == rot
    positions = torch.tensor([0, 5, 17, 4095, 300])
    rope = RopeBatch(rotary.halves(positions, 4095))
    t, width = len(positions), (heads + 2 * kv_heads) * head_dim
    qkv = torch.randn(t, width)
    want = qkv.clone()
    qk = want.view(t, -1, head_dim)[:, :heads + kv_heads]
    qk.copy_(RotaryEmbedding.apply(qk, *rope.cos_sin()))
    got = qkv.clone()
    rope.rotate_qk_(got, heads, kv_heads, head_dim)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    v = (heads + kv_heads) * head_dim
    assert torch.equal(got[:, v:], qkv[:, v:])


def test_torch_paths_when_kernels_disabled(monkeypatch):
    norm = _norm(64, 0)
    x, res = torch.randn(5, 64), torch.randn(5, 64)
    fused = norm(x.clone(), res.clone())
    monkeypatch.setattr(cpu_ops, "load", lambda family="core": None)
    plain = norm(x.clone(), res.clone())
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
