"""`pagedllm plan` and the start-up log on DeepSeek-V2 / V3: the latent KV bytes per token
(layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes, one row shared by every head),
total and active parameters with MLA's projections."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from pagedllm.entrypoints.cli import main
from pagedllm.memory_plan import load_config, parameter_counts, plan
from pagedllm.model.layers.moe import MoESpec
from tests.deepseek_configs import V2_LITE, V3
from tests.model.deepseek_checkpoints import LATENT_BYTES, VARIANTS, make_deepseek_checkpoint


def write(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_deepseek_v3_latent_kv_and_parameters(tmp_path) -> None:
    result = plan(load_config(str(write(tmp_path, V3))), kv_cache_memory_gib=8)
    assert result.parameters / 1e9 == pytest.approx(671.0, abs=0.1)  # DeepSeek's figure
    assert result.active_parameters / 1e9 == pytest.approx(37.5, abs=0.1)  # "37B activated"
    assert result.kv_bytes_per_token == 61 * (512 + 64) * 2  # bf16 latent rows
    text = "\n".join(result.lines())
    assert "70272 B = 68.625 KiB of latent KV" in text
    assert "61 layers x 576 (kv_lora_rank + qk_rope_head_dim) x 2 bytes" in text
    assert "256 experts of width 2048, top-8, a shared expert of width 2048, on 58 of 61" in text


def test_deepseek_v2_lite_parameters(tmp_path) -> None:
    total, _ = parameter_counts(load_config(str(write(tmp_path, V2_LITE))))
    assert total / 1e9 == pytest.approx(15.7, abs=0.05)
    result = plan(load_config(str(write(tmp_path, V2_LITE))), kv_cache_memory_gib=1)
    assert result.kv_bytes_per_token == 27 * 576 * 2
    assert result.num_blocks == 2**30 // (27 * 576 * 2 * 16)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_counts_equal_the_hf_model(variant, tmp_path, tiny_tokenizer) -> None:
    import transformers

    model_dir = make_deepseek_checkpoint(tmp_path, variant, tiny_tokenizer)
    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    total, active = parameter_counts(load_config(str(model_dir)))
    assert total == sum(p.numel() for p in hf.parameters())
    spec = MoESpec.from_config(hf.config)
    one_expert = 3 * 64 * 32
    assert total - active == sum(spec.sparse_layers) * (8 - 3) * one_expert


def test_cli_plan_and_engine_agree(tmp_path, tiny_tokenizer, make_llm, caplog, capsys) -> None:
    """`pagedllm plan` on the tiny V3 prints the latent bytes the engine's pool is sized by,
    and the start-up log says them."""
    model_dir = make_deepseek_checkpoint(tmp_path, "v3", tiny_tokenizer)
    assert main(["plan", str(model_dir), "--kv-cache-memory", str(2**20),
                 "--max-model-len", "256"]) == 0
    out = capsys.readouterr().out
    assert f"KV bytes per token: {LATENT_BYTES} B" in out and "of latent KV" in out
    caplog.set_level(logging.INFO, logger="pagedllm.worker.model_setup")
    llm = make_llm(model_dir, kv_cache_memory=2**20, max_model_len=256)
    assert llm.llm_engine.num_blocks == 2**20 // (16 * LATENT_BYTES)
    assert f"{2**20 // (16 * LATENT_BYTES)} blocks" in out
    line = next(r.getMessage() for r in caplog.records if "latent cache" in r.getMessage())
    assert f"{LATENT_BYTES} bytes/token = 3 layers x 32 latent values" in line
