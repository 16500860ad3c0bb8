"""RotaryEmbedding and rope scaling vs HF transformers' own implementation, config parsing,
overrides and the max_model_len check."""

from __future__ import annotations

import argparse
import logging
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, PhiConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from pagedllm.config import EngineConfig
from pagedllm.model.layers.attention import AttentionMetadata
from pagedllm.model.layers.rope_scaling import (
    apply_rope_overrides,
    parse_rope_scaling,
    rope_max_len,
    rope_parameters,
)
from pagedllm.model.layers.rotary import RotaryEmbedding, sequence_lengths

HEAD_DIM = 64
NUM_POSITIONS = 16384
TOL = 1e-5

CASES = {
    "default": (16384, {"rope_type": "default", "rope_theta": 10000.0}),
    "linear": (4096, {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}),
    "dynamic": (2048, {"rope_type": "dynamic", "factor": 8.0, "rope_theta": 10000.0}),
    "yarn": (4096, {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                    "original_max_position_embeddings": 4096}),
    "yarn_mscale": (16384, {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                            "original_max_position_embeddings": 4096, "beta_fast": 16,
                            "beta_slow": 2, "mscale": 0.707, "mscale_all_dim": 1.0,
                            "truncate": False}),
    "llama3": (16384, {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0,
                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 2048}),
}


def llama_config(max_position_embeddings: int, rope: dict) -> LlamaConfig:
    return LlamaConfig(hidden_size=4 * HEAD_DIM, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=max_position_embeddings,
                       rope_parameters=dict(rope))


def hf_cos_sin(cfg, positions: torch.Tensor, rotary_cls=LlamaRotaryEmbedding):
    """HF's cos/sin [T, dim] for one forward call over `positions` (a fresh module)."""
    cos, sin = rotary_cls(cfg)(torch.zeros(1), positions[None])
    return cos[0], sin[0]


@pytest.mark.parametrize("case", list(CASES))
def test_cos_sin_and_rotation_match_hf(case) -> None:
    cfg = llama_config(*CASES[case])
    positions = torch.arange(NUM_POSITIONS)
    hf_cos, hf_sin = hf_cos_sin(cfg, positions)
    ours = RotaryEmbedding.from_config(cfg, HEAD_DIM)
    cos, sin = ours.cos_sin(positions, NUM_POSITIONS - 1)
    assert cos.dtype == sin.dtype == torch.float32
    torch.testing.assert_close(cos[:, 0], hf_cos, rtol=0, atol=TOL)
    torch.testing.assert_close(sin[:, 0], hf_sin, rtol=0, atol=TOL)

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, NUM_POSITIONS, HEAD_DIM, generator=gen)
    k = torch.randn(1, 2, NUM_POSITIONS, HEAD_DIM, generator=gen)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, hf_cos[None], hf_sin[None])
    got_q = RotaryEmbedding.apply(q[0].transpose(0, 1), cos, sin)   # ours: [T, heads, d]
    got_k = RotaryEmbedding.apply(k[0].transpose(0, 1), cos, sin)
    torch.testing.assert_close(got_q, hf_q[0].transpose(0, 1), rtol=0, atol=TOL)
    torch.testing.assert_close(got_k, hf_k[0].transpose(0, 1), rtol=0, atol=TOL)


def test_half_precision_is_rotated_in_fp32_and_cast_back() -> None:
    cfg = llama_config(*CASES["default"])
    positions = torch.arange(9000, 9008)
    cos, sin = RotaryEmbedding.from_config(cfg, HEAD_DIM).cos_sin(positions, 9007)
    x = torch.randn(8, 4, HEAD_DIM).to(torch.bfloat16)
    out = RotaryEmbedding.apply(x, cos, sin)
    assert out.dtype == torch.bfloat16
    expected = RotaryEmbedding.apply(x.float(), cos, sin).to(torch.bfloat16)
    assert torch.equal(out, expected)


def test_positions_are_absolute_and_table_grows_on_demand() -> None:
    """Any subset of positions gets the rows of the full computation, and the table grows
    (doubling, capped at the RoPE maximum) only when a larger position arrives."""
    cfg = llama_config(*CASES["linear"])       # RoPE maximum 4096 x 4 = 16384
    rotary = RotaryEmbedding.from_config(cfg, HEAD_DIM)
    assert rotary.max_len == 16384
    full_cos, _ = hf_cos_sin(cfg, torch.arange(10000))
    cos, _ = rotary.cos_sin(torch.tensor([3, 700]), 700)
    assert rotary._cos_sin.shape[0] == 701
    torch.testing.assert_close(cos[:, 0], full_cos[[3, 700]], rtol=0, atol=TOL)
    cos, _ = rotary.cos_sin(torch.tensor([1200, 1201]), 1201)
    assert rotary._cos_sin.shape[0] == 1402
    torch.testing.assert_close(cos[:, 0], full_cos[[1200, 1201]], rtol=0, atol=TOL)
    rotary.cos_sin(torch.tensor([9999]), 9999)
    assert rotary._cos_sin.shape[0] == 10000
    rotary.cos_sin(torch.tensor([10000]), 10000)
    assert rotary._cos_sin.shape[0] == 16384


def test_dynamic_uses_each_sequence_length() -> None:
    """Tokens of sequences of lengths 3000, 2049, 2048, 900 in one call: each row equals HF's
    forward call for that sequence alone (unscaled up to max_position_embeddings=2048)."""
    cfg = llama_config(*CASES["dynamic"])
    rotary = RotaryEmbedding.from_config(cfg, HEAD_DIM)
    seqs = {3000: [0, 1500, 2999], 2049: [5, 2048], 2048: [2047], 900: [899]}
    positions = torch.tensor([p for ps in seqs.values() for p in ps])
    lengths = torch.tensor([n for n, ps in seqs.items() for _ in ps])
    cos, sin = rotary.cos_sin(positions, int(positions.max()), lengths)
    row = 0
    for n, ps in seqs.items():
        hf_cos, hf_sin = hf_cos_sin(cfg, torch.arange(n))
        for p in ps:
            torch.testing.assert_close(cos[row, 0], hf_cos[p], rtol=0, atol=TOL)
            torch.testing.assert_close(sin[row, 0], hf_sin[p], rtol=0, atol=TOL)
            row += 1
    # Rows differ where the lengths differ: 2049 is scaled, 2048 is not.
    assert not torch.allclose(cos[3], cos[0], atol=1e-3)


def test_sequence_lengths_per_request() -> None:
    """decodes d0 (pos 17), d1 (pos 4) | prefill chunks p0 (pos 5..7), p1 (pos 0..1)."""
    positions = torch.tensor([17, 4, 5, 6, 7, 0, 1])
    meta = AttentionMetadata(
        slot_mapping=positions, num_decodes=2, decode_block_tables=None, decode_seq_lens=None,
        sliding_window=None, prefill_block_tables=None,
        prefill_query_start=torch.tensor([0, 3, 5]), prefill_seq_lens=torch.tensor([8, 2]))
    assert sequence_lengths(positions, meta).tolist() == [18, 5, 8, 8, 8, 2, 2]
    decodes_only = AttentionMetadata(
        slot_mapping=positions[:2], num_decodes=2, decode_block_tables=None,
        decode_seq_lens=None, sliding_window=None, prefill_block_tables=None)
    assert sequence_lengths(positions[:2], decodes_only).tolist() == [18, 5]


def test_partial_rotary_matches_hf_phi() -> None:
    """Phi-style partial rotary: the first rotary_dim features rotate, the rest pass through."""
    from transformers.models.phi.modeling_phi import PhiRotaryEmbedding

    cfg = PhiConfig(hidden_size=4 * HEAD_DIM, num_attention_heads=4, partial_rotary_factor=0.5,
                    max_position_embeddings=4096)
    rotary = RotaryEmbedding.from_config(cfg, HEAD_DIM)
    assert rotary.rotary_dim == HEAD_DIM // 2
    positions = torch.arange(4096)
    hf_cos, hf_sin = hf_cos_sin(cfg, positions, PhiRotaryEmbedding)
    cos, sin = rotary.cos_sin(positions, 4095)
    torch.testing.assert_close(cos[:, 0], hf_cos, rtol=0, atol=TOL)
    q = torch.randn(1, 4, 4096, HEAD_DIM)
    rot, passed = q[..., :HEAD_DIM // 2], q[..., HEAD_DIM // 2:]
    hf_rot, _ = apply_rotary_pos_emb(rot, rot, hf_cos[None], hf_sin[None])
    expected = torch.cat([hf_rot, passed], -1)[0].transpose(0, 1)
    got = RotaryEmbedding.apply(q[0].transpose(0, 1), cos, sin)
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL)


# ---------------------------------------------------------------- config and overrides

def test_reads_both_config_layouts() -> None:
    legacy = SimpleNamespace(max_position_embeddings=4096, rope_theta=500000.0,
                             rope_scaling={"type": "yarn", "factor": 4.0})
    assert rope_parameters(legacy) == {"rope_type": "yarn", "factor": 4.0,
                                       "rope_theta": 500000.0,
                                       "original_max_position_embeddings": 4096}
    current = LlamaConfig(max_position_embeddings=4096, rope_theta=500000.0,
                          rope_scaling={"type": "yarn", "factor": 4.0})
    assert rope_parameters(current) == rope_parameters(legacy)
    plain = SimpleNamespace(max_position_embeddings=2048)
    assert rope_parameters(plain) == {"rope_type": "default", "rope_theta": 10000.0}


def test_overrides_replace_scaling_and_theta() -> None:
    cfg = LlamaConfig(max_position_embeddings=2048,
                      rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5})
    apply_rope_overrides(cfg, parse_rope_scaling('{"type": "dynamic", "factor": 4}'), None)
    assert cfg.rope_parameters == {"rope_type": "dynamic", "factor": 4, "rope_theta": 5e5}
    apply_rope_overrides(cfg, None, 1e6)
    assert cfg.rope_parameters["rope_theta"] == 1e6
    apply_rope_overrides(cfg, {"rope_type": "default"}, None)
    assert cfg.rope_parameters == {"rope_type": "default", "rope_theta": 1e6}
    # HF's own rotary module reads the overridden config like ours does.
    assert torch.equal(LlamaRotaryEmbedding(cfg).inv_freq,
                       RotaryEmbedding.from_config(cfg, cfg.head_dim).inv_freq)

    legacy = SimpleNamespace(max_position_embeddings=2048, rope_theta=1e4, rope_scaling=None)
    apply_rope_overrides(legacy, {"rope_type": "yarn", "factor": 4.0}, 2e4)
    assert legacy.rope_theta == 2e4
    assert legacy.rope_scaling == {"rope_type": "yarn", "factor": 4.0,
                                   "original_max_position_embeddings": 2048}


@pytest.mark.parametrize(("bad", "match"), [
    ("{not json", "not valid JSON"),
    ('["yarn"]', "JSON object"),
    ('{"rope_type": "su"}', "not supported"),
    ('{"rope_type": "longrope"}', "needs short_factor, long_factor"),
    ('{"rope_type": "linear"}', "needs factor"),
    ('{"rope_type": "llama3", "factor": 8}', "low_freq_factor"),
    ('{"rope_type": "dynamic", "factor": 0.5}', ">= 1"),
])
def test_bad_rope_scaling_is_refused(bad, match) -> None:
    with pytest.raises(ValueError, match=match):
        EngineConfig(rope_scaling=bad)


def test_rope_max_len() -> None:
    def cfg(mpe, rope):
        return LlamaConfig(max_position_embeddings=mpe, rope_parameters=rope)

    assert rope_max_len(cfg(2048, {"rope_type": "default"}))[0] == 2048
    assert rope_max_len(cfg(2048, {"rope_type": "linear", "factor": 4.0}))[0] == 8192
    assert rope_max_len(cfg(2048, {"rope_type": "dynamic", "factor": 2.0}))[0] == 4096
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    assert rope_max_len(cfg(32768, yarn))[0] == 131072
    llama31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert rope_max_len(cfg(131072, llama31))[0] == 131072   # already the scaled length


def test_long_max_model_len_needs_scaling_or_the_flag(caplog) -> None:
    with pytest.raises(ValueError, match=r"(?s)exceeds.*2048.*--rope-scaling.*"
                                         r"--allow-long-max-model-len"):
        EngineConfig(max_model_len=4096).finalize(2048, "max_position_embeddings=2048")
    config = EngineConfig(max_model_len=4096, allow_long_max_model_len=True)
    with caplog.at_level(logging.WARNING, logger="pagedllm.config"):
        config.finalize(2048)
    assert config.max_model_len == 4096
    assert "allow_long_max_model_len" in caplog.text


def test_engine_refuses_long_max_model_len(tiny_llama_dir, make_llm) -> None:
    with pytest.raises(ValueError, match="max_model_len=4096 exceeds .* 1024"):
        make_llm(tiny_llama_dir, max_model_len=4096)
    llm = make_llm(tiny_llama_dir, max_model_len=4096,
                   rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert llm.llm_engine.config.max_model_len == 4096


def test_cli_flags() -> None:
    from pagedllm.entrypoints.args import add_engine_args, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--rope-scaling", '{"type": "yarn", "factor": 4.0}',
                              "--rope-theta", "1e6", "--allow-long-max-model-len"])
    config = engine_config_from_args(args)
    assert config.rope_scaling == {"rope_type": "yarn", "factor": 4.0}
    assert config.rope_theta == 1e6
    assert config.allow_long_max_model_len
    with pytest.raises(SystemExit):
        parser.parse_args(["--rope-scaling", '{"type": "su"}'])
