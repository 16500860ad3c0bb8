"""`pagedllm plan`, the engine plan and the start-up log on mixture-of-experts models: total
vs active parameters, the experts' memory, CUDA graphs off."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from pagedllm.config import EngineConfig
from pagedllm.core.kv_groups import KVGroupLayout
from pagedllm.engine.plan import resolve_plan
from pagedllm.entrypoints.cli import main
from pagedllm.memory_plan import GiB, load_config, parameter_counts, plan
from pagedllm.model.layers.moe import MoESpec
from tests.model.family_checkpoints import FAMILIES, make_family_checkpoint

MIXTRAL_8X7B = dict(
    architectures=["MixtralForCausalLM"],
    model_type="mixtral",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=32000,
    max_position_embeddings=32768,
    num_local_experts=8,
    num_experts_per_tok=2,
    torch_dtype="bfloat16",
)
# Hub config.json of Qwen3-30B-A3B (`num_experts`, not transformers 5's num_local_experts).
QWEN3_30B_A3B = dict(
    architectures=["Qwen3MoeForCausalLM"],
    model_type="qwen3_moe",
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    vocab_size=151936,
    max_position_embeddings=40960,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    torch_dtype="bfloat16",
)


def write(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_mixtral_8x7b_total_and_active_parameters(tmp_path) -> None:
    result = plan(load_config(str(write(tmp_path, MIXTRAL_8X7B))), kv_cache_memory_gib=8)
    assert result.parameters / 1e9 == pytest.approx(46.70, abs=0.01)  # Mistral's figures
    assert result.active_parameters / 1e9 == pytest.approx(12.88, abs=0.01)
    assert result.weight_bytes == 2 * result.parameters  # bf16
    assert result.expert_bytes == 32 * 8 * 3 * 4096 * 14336 * 2  # 84 GiB
    text = "\n".join(result.lines())
    assert "8 experts of width 14336, top-2, on 32 of 32 layers" in text
    assert "46.70B total, 12.88B active per token (28%)" in text
    assert "84.00 GiB of the weights (336.0 MiB per expert per layer)" in text


def test_qwen3_30b_a3b(tmp_path) -> None:
    total, active = parameter_counts(load_config(str(write(tmp_path, QWEN3_30B_A3B))))
    assert total / 1e9 == pytest.approx(30.5, abs=0.05)  # "30.5B total, 3.3B activated"
    assert active / 1e9 == pytest.approx(3.35, abs=0.05)


def test_dense_models_have_no_moe_lines(tmp_path) -> None:
    dense = {**MIXTRAL_8X7B, "architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    result = plan(load_config(str(write(tmp_path, dense))), kv_cache_memory_gib=8)
    assert result.moe is None and result.parameters == result.active_parameters
    assert not any("experts" in line for line in result.lines())


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_counts_equal_the_hf_model(family, tmp_path, tiny_tokenizer) -> None:
    """On each tiny family (Qwen2-MoE: shared expert and a dense layer; OLMo 2, Granite,
    SmolLM3 dense) the plan's total is the HF model's parameter count, and its active count
    leaves out E - k experts per sparse layer exactly."""
    import transformers

    model_dir = make_family_checkpoint(tmp_path, family, tiny_tokenizer)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    total, active = parameter_counts(load_config(str(model_dir)))
    assert total == sum(p.numel() for p in hf.parameters())
    spec = MoESpec.from_config(hf.config)
    if spec is None:
        assert active == total
        return
    experts = [m for m in hf.modules() if type(m).__name__.endswith("Experts")]
    assert len(experts) == sum(spec.sparse_layers) >= 1
    one_expert = sum(p[0].numel() for p in experts[0].parameters())
    assert total - active == len(experts) * (spec.num_experts - spec.top_k) * one_expert


def test_cli_plan_prints_the_moe_lines(tmp_path, capsys) -> None:
    assert (
        main(
            [
                "plan",
                str(write(tmp_path, QWEN3_30B_A3B)),
                "--memory",
                "80",  # bf16 on CPU: linear layers and experts in bf16 (61 GB)
                "--max-model-len",
                "8192",
                "--dtype",
                "bfloat16",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "128 experts of width 768, top-8, on 48 of 48 layers" in out
    assert "30.53B total, 3.35B active per token" in out


def test_budget_leaves_room_for_the_experts_rows(tmp_path) -> None:
    """The activation estimate counts a MoE step's k copies of each token row."""
    cfg = load_config(str(write(tmp_path, QWEN3_30B_A3B)))
    moe = plan(cfg, memory_gib=80, max_num_batched_tokens=8192)
    dense = plan(
        load_config(str(write(tmp_path, {**QWEN3_30B_A3B, "model_type": "qwen3"}))),
        memory_gib=80,
        max_num_batched_tokens=8192,
    )
    rows = 8192 * 8 * 2 * (2048 + 768) * 2 - 8192 * 2 * 6144 * 2
    assert dense.kv_budget - moe.kv_budget - (moe.weight_bytes - dense.weight_bytes) == rows
    assert moe.kv_budget < 80 * GiB


def test_cuda_graphs_off_for_moe() -> None:
    config = EngineConfig(device="cuda")
    layout = KVGroupLayout.single(2)
    dense = dict(MIXTRAL_8X7B, model_type="mistral", rope_theta=1e6)
    assert resolve_plan(config, type("C", (), dense)(), layout).cuda_graphs
    moe = dict(MIXTRAL_8X7B, rope_theta=1e6)
    assert not resolve_plan(config, type("C", (), moe)(), layout).cuda_graphs


def test_startup_log_names_total_and_active(tmp_path, tiny_tokenizer, make_llm, caplog) -> None:
    caplog.set_level(logging.INFO, logger="pagedllm.model.models.moe")
    model_dir = make_family_checkpoint(tmp_path, "qwen2_moe", tiny_tokenizer)
    make_llm(model_dir)
    total, active = parameter_counts(load_config(str(model_dir)))
    line = next(r.getMessage() for r in caplog.records if "mixture of experts" in r.getMessage())
    assert "4 experts of width 48, top-2, a shared expert of width 80, on 1 of 2 layers" in line
    assert f"{active / 1e6:.1f}M of {total / 1e6:.1f}M parameters active per token" in line
    assert f"routed experts hold {4 * 3 * 64 * 48 * 4 / 2**20:.1f} MiB" in line
