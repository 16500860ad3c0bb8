"""`pagedllm plan`: the KV formula and what fits, from a config.json alone."""

from __future__ import annotations

import json

import pytest

from pagedllm.entrypoints.cli import main
from pagedllm.memory_plan import GiB, load_config, plan

LLAMA2_7B = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096,
                 intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, head_dim=128, vocab_size=32000,
                 max_position_embeddings=4096, torch_dtype="float16")


@pytest.fixture
def cfg_path(tmp_path):
    def write(**overrides):
        p = tmp_path / f"config{len(overrides)}.json"
        p.write_text(json.dumps({**LLAMA2_7B, **overrides}))
        return p
    return write


def test_llama2_7b_kv_formula(cfg_path):
    result = plan(load_config(str(cfg_path())), memory_gib=80)
    assert result.kv_bytes_per_token == 512 * 1024
    assert result.kv_bytes_per_seq == 2 * GiB            # 4096 tokens
    assert abs(result.weight_bytes / 1e9 - 13.48) < 0.05  # 6.74B params in fp16


def test_gqa_is_a_quarter(cfg_path):
    full = plan(load_config(str(cfg_path())), kv_cache_memory_gib=16)
    gqa = plan(load_config(str(cfg_path(num_key_value_heads=8))), kv_cache_memory_gib=16)
    assert gqa.kv_bytes_per_token * 4 == full.kv_bytes_per_token == 512 * 1024
    assert gqa.kv_bytes_per_seq == GiB // 2
    assert gqa.full_length_seqs == 4 * full.full_length_seqs == 32


def test_pairs_and_int8(cfg_path):
    fp16 = plan(load_config(str(cfg_path())), kv_cache_memory_gib=16)
    assert dict(fp16.pairs)[4096] == 8 and dict(fp16.pairs)[512] == 64
    result = plan(load_config(str(cfg_path())), kv_cache_memory_gib=16, kv_dtype_bytes=1)
    # int8 values plus one scale per token per KV head (counted in the budget).
    scale = result.kv_spec.scale_bytes
    assert result.kv_bytes_per_token == 2 * 32 * 32 * (128 + scale)
    assert 15 <= dict(result.pairs)[4096] <= 16


def test_cli_prints_plan(cfg_path, capsys):
    assert main(["plan", str(cfg_path()), "--memory", "24", "--max-model-len", "4096",
                 "--max-num-seqs", "8", "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    assert "512 KiB" in out and "2.000 GiB" in out and "does NOT fit" in out


def test_missing_config_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_config(str(tmp_path / "nope"))


def test_engine_refuses_a_pool_without_room_for_one_sequence(tiny_llama_dir):
    from pagedllm import LLM

    # 2 layers x 2 kv heads x 16 head_dim x 4 bytes x 2 = 512 B/token; 64 KiB = 128 tokens.
    with pytest.raises(ValueError, match=r"raise kv_cache_memory .* or lower max_model_len to 128"):
        LLM(str(tiny_llama_dir), kv_cache_memory=64 * 1024, max_model_len=1024, num_threads=1)


GEMMA3_270M = dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                   hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                   num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                   vocab_size=262144, max_position_embeddings=32768, sliding_window=512,
                   layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                for i in range(18)], torch_dtype="bfloat16",
                   tie_word_embeddings=True)


def test_gemma3_270m_sliding_groups_at_32k(tmp_path, capsys):
    """5 sliding groups keep ~33 blocks of 16 tokens each; the 3 full layers keep all."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GEMMA3_270M))
    result = plan(load_config(str(path)), kv_cache_memory_gib=4, max_model_len=32768)
    spec = result.kv_spec
    assert spec.layers_per_block == 3 and spec.groups.num_groups == 6
    layer_token = 2 * 1 * 256 * 2                      # K and V, 1 KV head, bf16
    assert result.kv_bytes_per_token == 18 * layer_token
    assert result.kv_bytes_per_seq == (2048 + 5 * 33) * 16 * 3 * layer_token
    text = "\n".join(result.lines())
    assert "group 0 (full, layers 5,11,17): 3072 B/token" in text
    assert "group 1 (sliding 512, layers 0,1,2): 3072 B/token" in text
    ratio = 32768 * 18 * layer_token / result.kv_bytes_per_seq
    assert 5.5 < ratio < 5.6 and f"({ratio:.2f}x)" in text
    assert main(["plan", str(path), "--kv-cache-memory", "4GiB", "--max-model-len", "32768"]) == 0
    assert f"keeping every layer's KV ({ratio:.2f}x)" in capsys.readouterr().out
    # Without freeing: one group of 18 layers.
    assert main(["plan", str(path), "--kv-cache-memory", "4GiB", "--max-model-len", "32768",
                 "--disable-hybrid-kv-cache-manager"]) == 0
    assert "KV groups" not in capsys.readouterr().out
