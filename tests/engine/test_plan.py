"""engine/plan.py: the cross-feature rules, decided from the config and the model's config,
without loading anything."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

import pagedllm.worker.rank_builder as rank_builder
from pagedllm.config import EngineConfig
from pagedllm.core.kv_groups import KVGroupLayout
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.plan import resolve_plan, split_kv_budget
from pagedllm.kernels import cpu_ops
from pagedllm.worker.model_setup import kv_layout, single_kv_group


def hf(**kw) -> SimpleNamespace:
    return SimpleNamespace(rope_theta=10000.0, max_position_embeddings=2048, **kw)


def test_prefix_caching_stays_on_for_a_plain_model() -> None:
    plan = resolve_plan(EngineConfig(), hf(), KVGroupLayout.single(4))
    assert plan.prefix_caching and not plan.single_kv_group and not plan.cuda_graphs


def test_dynamic_rope_turns_prefix_caching_off_and_leaves_the_config_alone() -> None:
    config = EngineConfig()
    plan = resolve_plan(config, hf(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
                        KVGroupLayout.single(4))
    assert not plan.prefix_caching and config.enable_prefix_caching


def test_all_sliding_layers_turn_prefix_caching_off() -> None:
    config = EngineConfig()
    sliding = kv_layout(config, [512] * 4)
    assert not resolve_plan(config, hf(), sliding).prefix_caching
    mixed = kv_layout(config, [512, None, 512, None])
    assert resolve_plan(config, hf(), mixed).prefix_caching


def test_one_kv_group_when_asked_or_under_tensor_parallelism() -> None:
    assert single_kv_group(EngineConfig(disable_hybrid_kv_cache_manager=True))
    assert single_kv_group(EngineConfig(tensor_parallel_size=2))
    assert kv_layout(EngineConfig(tensor_parallel_size=2), [512, None]).num_groups == 1
    assert kv_layout(EngineConfig(), [512, None]).num_groups == 2


def test_cuda_graphs_never_on_cpu_nor_with_speculation() -> None:
    assert not resolve_plan(EngineConfig(), hf(), KVGroupLayout.single(2)).cuda_graphs


def test_a_draft_model_takes_its_share_of_the_budget() -> None:
    assert split_kv_budget(1000, 300, None) == 1000
    assert split_kv_budget(1000, 300, 100) == 750


def test_offline_engine_refuses_tp_with_quantized_weights_before_loading(tmp_path,
                                                                         monkeypatch) -> None:
    """LLM() / LLMEngine refuse what tensor parallelism cannot run as the CLI does: before the
    checkpoint, the kernels or a process is touched."""
    def reached(*_a, **_k):
        raise AssertionError("loaded something before refusing")

    monkeypatch.setattr(rank_builder, "load_checkpoint", reached)
    monkeypatch.setattr(cpu_ops, "load", reached)
    model = tmp_path / "awq"
    model.mkdir()  # never read past config.json, which says what it holds
    (model / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "awq"}}))
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"quantized weights \(awq\)"):
        LLMEngine(EngineConfig(model=str(model), tensor_parallel_size=2))
    assert time.perf_counter() - t0 < 1.0
