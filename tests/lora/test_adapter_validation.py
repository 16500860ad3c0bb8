"""Adapter loading and the validation errors for the classic mistakes (PEFT rules)."""

from __future__ import annotations

import pytest
import torch
import transformers
from lora_adapters import lora_tensors, write_adapter

from pagedllm.lora.adapter import AdapterError, load_adapter
from pagedllm.lora.targets import model_module_specs, peft_matches
from pagedllm.model.models.llama import LlamaForCausalLM

# tiny Llama: hidden 64, 4 heads x 16 (q 64), 2 kv heads (k, v 32), intermediate 128, 2 layers
QV = {f"model.layers.{i}.self_attn.{p}": (64, 64 if p == "q_proj" else 32)
      for i in range(2) for p in ("q_proj", "v_proj")}


@pytest.fixture(scope="module")
def specs():
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512)
    with torch.device("meta"):
        return model_module_specs(LlamaForCausalLM(cfg))


def load(path, specs, max_rank=16):
    return load_adapter(path, specs, name="ad", int_id=1, max_rank=max_rank)


def test_fused_layout_and_scales(tmp_path, specs) -> None:
    t = lora_tensors(QV)
    ad = load(write_adapter(tmp_path / "a", {}, t), specs)
    q, v = ad.deltas["model.layers.0.self_attn.qkv_proj"]
    assert (q.sub, q.num_subs, q.offset) == (0, 3, 0)
    assert (v.sub, v.num_subs, v.offset) == (2, 3, 96)
    key = "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"
    torch.testing.assert_close(v.b, t[key] * 2.0)  # alpha 8 / r 4
    rs = load(write_adapter(tmp_path / "rs", {"use_rslora": True}, t), specs)
    torch.testing.assert_close(rs.deltas["model.layers.0.self_attn.qkv_proj"][1].b,
                               t[key] * 4.0)  # alpha 8 / sqrt(4)
    assert ad.rank == 4 and len(ad.weights_hash) == 64 and ad.weights_hash != rs.weights_hash


def test_regex_layers_to_transform_and_rank_pattern(tmp_path, specs) -> None:
    regex = r"model\.layers\.\d+\.self_attn\.(q|v)_proj"
    ad = load(write_adapter(tmp_path / "re", {"target_modules": regex}, lora_tensors(QV)), specs)
    assert len(ad.deltas) == 2
    one = {k: v for k, v in QV.items() if ".1." in k}
    ad = load(write_adapter(tmp_path / "l1", {"layers_to_transform": [1]}, lora_tensors(one)),
              specs)
    assert list(ad.deltas) == ["model.layers.1.self_attn.qkv_proj"]
    t = lora_tensors({k: v for k, v in QV.items() if "q_proj" in k}, r=4)
    t.update(lora_tensors({k: v for k, v in QV.items() if "v_proj" in k}, r=2, seed=1))
    ad = load(write_adapter(tmp_path / "rp", {"rank_pattern": {"v_proj": 2},
                                              "alpha_pattern": {"v_proj": 6}}, t), specs)
    v = ad.deltas["model.layers.0.self_attn.qkv_proj"][1]
    key = "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight"
    torch.testing.assert_close(v.b, t[key] * 3.0)  # alpha 6 / r 2
    assert peft_matches("model.layers.0.mlp.up_proj", ["up_proj"])
    assert not peft_matches("model.layers.0.mlp.up_proj", ["p_proj"])  # suffix after a dot
    assert not peft_matches("model.layers.0.mlp.up_proj", "up_proj")  # regex: fullmatch


@pytest.mark.parametrize("config, tensors, message", [
    ({"target_modules": ["query_key_value"]}, QV,
     r"target module 'query_key_value' matches no module of the model; the model's linear "
     r"layers are down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj"),
    ({"target_modules": ["model.layers.5.self_attn.q_proj"]}, QV,
     r"'model.layers.5.self_attn.q_proj' matches no module"),
    ({"target_modules": ".*attn_qkv"}, QV, r"target_modules '.\*attn_qkv' match no module"),
    ({"target_modules": ["input_layernorm"]}, QV, r"is a norm layer \(RMSNorm\)"),
    ({"target_modules": ["lm_head"]}, QV, r"is the lm_head; LoRA on embeddings and lm_head"),
    ({"target_modules": ["embed_tokens"]}, QV, r"is the embedding"),
    ({"target_modules": r".*self_attn"}, QV, r"a LlamaAttention module, not a linear layer"),
    ({"use_dora": True}, QV, r"uses DoRA"),
    ({"modules_to_save": ["lm_head"]}, QV, r"has modules_to_save \['lm_head'\]"),
    ({"bias": "all"}, QV, r"only bias='none' is supported"),
    ({}, {**QV, "model.layers.5.self_attn.q_proj": (64, 64)},
     r"has weights for 'model.layers.5.self_attn.q_proj', which is not a module of the model"),
    ({}, {k: (32, 32) for k in QV}, r"base-model mismatch at model.layers.0.self_attn.q_proj: "
     r"the adapter maps 32 -> 32 features, the model's layer 64 -> 64"),
    ({"target_modules": ["q_proj", "v_proj", "o_proj"]}, QV, r"no lora_A/lora_B for it"),
])
def test_validation_errors(tmp_path, specs, config, tensors, message) -> None:
    path = write_adapter(tmp_path / "bad", config, lora_tensors(tensors))
    with pytest.raises(AdapterError, match=message) as err:
        load(path, specs)
    assert "adapter 'ad'" in str(err.value)


def test_rank_and_path_errors(tmp_path, specs) -> None:
    path = write_adapter(tmp_path / "r32", {"r": 32}, lora_tensors(QV, r=32))
    with pytest.raises(AdapterError, match="rank 32 .* exceeds max_lora_rank 16"):
        load(path, specs)
    with pytest.raises(AdapterError, match="is not a PEFT adapter directory"):
        load(tmp_path / "missing", specs)
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "adapter_config.json").write_text('{"r": 4, "target_modules": ["q_proj"]}')
    with pytest.raises(AdapterError, match="has no adapter_model.safetensors"):
        load(tmp_path / "noweights", specs)


def test_bin_weights_and_fan_in_fan_out(tmp_path, specs) -> None:
    """adapter_model.bin (torch.save) loads like safetensors; fan_in_fan_out=true is a no-op
    on nn.Linear layers (PEFT resets it too) and is accepted."""
    t = lora_tensors(QV)
    ref = load(write_adapter(tmp_path / "st", {}, t), specs)
    path = write_adapter(tmp_path / "bin", {"fan_in_fan_out": True}, t)
    (path / "adapter_model.safetensors").unlink()
    torch.save(t, path / "adapter_model.bin")
    ad = load(path, specs)
    for name, deltas in ref.deltas.items():
        for a, b in zip(deltas, ad.deltas[name], strict=True):
            torch.testing.assert_close(a.b, b.b)
            torch.testing.assert_close(a.a, b.a)
