"""What `--dtype` resolves to (config/dtype.py): compute and linear-weight dtypes per device,
and the rules of 'auto' on CPU, with the CPU's flags given (no dependence on this machine)."""

from __future__ import annotations

import pytest
import torch

from pagedllm.config import EngineConfig
from pagedllm.config.dtype import AUTO_DTYPE_ENV, auto_linear_dtype, linear_dtype, resolve_dtype
from pagedllm.kernels import cpu_features
from pagedllm.worker.model_setup import float_weights

CPU = torch.device("cpu")
BF16_CPU = ("avx2", "avx512_bf16", "avx512f", "fma")
AMX_CPU = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f")
AVX2_CPU = ("avx2", "f16c", "fma")


@pytest.fixture
def unpinned(monkeypatch):
    monkeypatch.delenv(AUTO_DTYPE_ENV, raising=False)


def test_bf16_on_cpu_is_bf16_linear_weights_under_fp32():
    for name in ("bfloat16", "bf16", torch.bfloat16):
        assert resolve_dtype(name, CPU) == torch.float32
        assert linear_dtype(name, CPU) == torch.bfloat16
    config = EngineConfig(device="cpu", dtype="bfloat16")
    assert config.torch_dtype == config.torch_kv_cache_dtype == torch.float32
    assert config.linear_dtype == torch.bfloat16 and config.bf16_linear_weights
    config.resolve_linear_dtype(float_weights=False)  # explicit: never changed
    assert config.linear_dtype == torch.bfloat16
    half = EngineConfig(device="cpu", dtype="float16")
    assert half.torch_dtype == half.linear_dtype == torch.float16
    assert not half.bf16_linear_weights
    with pytest.raises(ValueError, match="dtype must be one of"):
        EngineConfig(device="cpu", dtype="float8")


def test_cuda_dtypes_are_unchanged():
    cuda = torch.device("cuda")
    assert resolve_dtype("bfloat16", cuda) == linear_dtype("bfloat16", cuda) == torch.bfloat16
    assert resolve_dtype("float32", cuda) == torch.float32


@pytest.mark.usefixtures("unpinned")
def test_auto_follows_the_cpu():
    assert auto_linear_dtype(True, "bfloat16", BF16_CPU)[0] == torch.bfloat16
    dtype, why = auto_linear_dtype(True, "float32", AMX_CPU)
    assert dtype == torch.bfloat16 and "amx_bf16" in why
    dtype, why = auto_linear_dtype(True, "bfloat16", AVX2_CPU)
    assert dtype == torch.float32 and "no bf16 matrix instructions" in why
    assert cpu_features.bf16_matrix_isa(()) is None


@pytest.mark.usefixtures("unpinned")
def test_auto_follows_the_weights():
    dtype, why = auto_linear_dtype(False, "bfloat16", BF16_CPU)
    assert dtype == torch.float32 and "quantized" in why
    dtype, why = auto_linear_dtype(True, torch.float16, BF16_CPU)
    assert dtype == torch.float32 and "float16" in why
    assert auto_linear_dtype(True, None, BF16_CPU)[0] == torch.bfloat16  # unknown: float
    # float once loaded: a float checkpoint, or anything with --quantization none
    assert float_weights("none", None) and float_weights("gguf", "none")
    assert float_weights("awq", "none")
    assert not float_weights("gguf", None) and not float_weights("none", "int8")
    assert not float_weights("gptq", "gptq")


def test_the_environment_pins_auto(monkeypatch):
    monkeypatch.setenv(AUTO_DTYPE_ENV, "float32")
    assert auto_linear_dtype(True, "bfloat16", AMX_CPU) == (
        torch.float32, f"{AUTO_DTYPE_ENV}=float32")
    monkeypatch.setenv(AUTO_DTYPE_ENV, "bfloat16")
    assert auto_linear_dtype(True, "bfloat16", AVX2_CPU)[0] == torch.bfloat16
    monkeypatch.setenv(AUTO_DTYPE_ENV, "fp8")
    with pytest.raises(ValueError, match=AUTO_DTYPE_ENV):
        auto_linear_dtype(True, "bfloat16", AMX_CPU)


@pytest.mark.usefixtures("unpinned")
def test_engine_config_settles_auto_once_and_logs_why(monkeypatch, caplog):
    import logging

    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: BF16_CPU)
    config = EngineConfig(device="cpu")
    assert config.torch_dtype == torch.float32 and config.linear_dtype is None
    with caplog.at_level(logging.INFO, logger="pagedllm.config.engine"):
        config.resolve_linear_dtype(float_weights=True, checkpoint_dtype="bfloat16")
    assert config.linear_dtype == torch.bfloat16 and config.bf16_linear_weights
    assert "dtype auto: bfloat16 linear weights" in caplog.text
    assert "avx512_bf16" in caplog.text
    config.resolve_linear_dtype(float_weights=False)  # settled: stays
    assert config.linear_dtype == torch.bfloat16
