"""`pagedllm plan` and the engine agree: same dtype, KV bytes per token, blocks, weight bytes and
max_model_len for the same model and flags (3 tiny checkpoints x 3 dtypes, plus an int8 cache),
and plan refuses what the engine refuses."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors import safe_open

from pagedllm.config import EngineConfig
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.entrypoints.cli import main
from pagedllm.memory_plan import load_config, plan_for_engine
from pagedllm.worker.model_setup import weight_bytes

KV = 4 * 2**20  # small pools: the engines are built for their numbers only


def _checkpoint_params(model_dir) -> int:
    total = 0
    for f in model_dir.glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            total += sum(math.prod(h.get_slice(k).get_shape()) for k in h.keys())  # noqa: SIM118
    return total


@pytest.fixture(params=["tiny_llama_dir", "tiny_qwen2_dir", "tiny_mistral_dir"])
def model_dir(request):
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("dtype", ["auto", "bfloat16", "float16"])
def test_plan_equals_engine(model_dir, dtype):
    args = dict(model=str(model_dir), dtype=dtype, device="cpu", kv_cache_memory=KV,
                num_threads=1)
    result = plan_for_engine(load_config(str(model_dir)), EngineConfig(**args))
    engine = LLMEngine(EngineConfig(**args))
    assert result.dtype == engine.config.torch_dtype
    # bf16 on CPU: bf16 linear weights under fp32 compute (config/dtype.py)
    assert result.dtype == (torch.float16 if dtype == "float16" else torch.float32)
    assert result.kv_spec == engine.kv_spec
    assert result.kv_bytes_per_token == engine.kv_spec.bytes_per_token
    assert result.num_blocks == engine.num_blocks
    assert result.max_model_len == engine.config.max_model_len
    assert result.bf16_linear == (dtype == "bfloat16")
    if dtype == "bfloat16":  # what the engine holds: bf16 matrices, a tied lm_head's copy
        assert result.weight_bytes == weight_bytes(engine.model)
    else:
        assert result.weight_bytes == _checkpoint_params(model_dir) * result.dtype.itemsize


def test_plan_equals_engine_int8_cache(tiny_llama_dir):
    args = dict(model=str(tiny_llama_dir), kv_cache_dtype="int8", kv_cache_memory=KV,
                max_model_len=512, num_threads=1)
    result = plan_for_engine(load_config(str(tiny_llama_dir)), EngineConfig(**args))
    engine = LLMEngine(EngineConfig(**args))
    assert result.kv_spec == engine.kv_spec and result.num_blocks == engine.num_blocks
    assert result.kv_spec.dtype == torch.int8 and result.dtype == torch.float32


def test_cpu_default_budget_is_the_engines(tiny_llama_dir):
    from pagedllm.worker.model_setup import DEFAULT_CPU_KV_BYTES

    result = plan_for_engine(load_config(str(tiny_llama_dir)), EngineConfig(device="cpu"))
    assert result.kv_budget == DEFAULT_CPU_KV_BYTES


def test_too_long_max_model_len_refused_like_the_engine(tiny_llama_dir):
    args = dict(model=str(tiny_llama_dir), max_model_len=4096, kv_cache_memory=KV)
    with pytest.raises(ValueError) as planned:
        plan_for_engine(load_config(str(tiny_llama_dir)), EngineConfig(**args))
    with pytest.raises(ValueError) as engine:
        LLMEngine(EngineConfig(**args))
    assert str(planned.value) == str(engine.value)
    assert "exceeds the model's maximum context length 1024" in str(planned.value)
    allowed = plan_for_engine(load_config(str(tiny_llama_dir)),
                              EngineConfig(**args, allow_long_max_model_len=True))
    assert allowed.max_model_len == 4096


def test_weights_that_do_not_fit_are_an_error(tiny_llama_dir, capsys):
    with pytest.raises(ValueError, match=r"weights .* do not fit"):
        plan_for_engine(load_config(str(tiny_llama_dir)), EngineConfig(device="cpu"),
                        memory_bytes=2**20)
    assert main(["plan", str(tiny_llama_dir), "--memory", "1MiB"]) == 2
    assert "do not fit" in capsys.readouterr().err


def test_cli_plan_prints_the_engine_dtype(tiny_llama_dir, capsys):
    assert main(["plan", str(tiny_llama_dir), "--kv-cache-memory", "4MiB"]) == 0
    out = capsys.readouterr().out
    assert "(float32)" in out and "KV cache dtype:     float32" in out
    # 2 layers x 2 kv heads x 16 head_dim x 4 bytes x 2 = 512 B/token; 4 MiB = 8192 tokens.
    assert "512 B" in out and "512 blocks of 16 tokens" in out
    assert main(["plan", str(tiny_llama_dir), "--kv-cache-memory", "4MiB", "--dtype",
                 "bfloat16"]) == 0
    assert "(bf16 linear layers and embeddings, float32 norms)" in capsys.readouterr().out
