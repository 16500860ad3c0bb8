"""Write a tiny HF DeepSeek-V2 / V3 checkpoint as a `deepseek2` GGUF file the way llama.cpp's
converter (convert_hf_to_gguf.py, DeepseekV2Model) lays it out:

  * metadata: head_count_kv 1, key_length kv_lora_rank + rope, value_length kv_lora_rank
    (MLA as MQA), key_length_mla / value_length_mla the per-head sizes, q / kv lora ranks,
    leading_dense_block_count, the experts' counts, scale, norm, gating function (sigmoid:
    V3), group counts, YaRN with yarn_log_multiplier = 0.1 x mscale_all_dim;
  * kv_b_proj split per head into attn_k_b [H, r, nope] (transposed for the absorbed
    product) and attn_v_b [H, v, r] (`legacy_kv_b=True`: one attn_kv_b, as older files);
  * experts stacked per layer, e_score_correction_bias as exp_probs_b.bias, q/k rows as HF
    holds them (llama.cpp rotates deepseek2 in interleaved pairs, as HF does);
  * matrices in `qtype`, routers, norms and vectors in F32.

`file_values` gives the HF tensors as the file holds them (each quantized part's round trip),
the reference HF transformers runs on.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

from tests.loader.gguf_writer import _add_tokenizer

_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.q_a_proj": "attn_q_a",
    "self_attn.q_a_layernorm": "attn_q_a_norm",
    "self_attn.q_b_proj": "attn_q_b",
    "self_attn.kv_a_proj_with_mqa": "attn_kv_a_mqa",
    "self_attn.kv_a_layernorm": "attn_kv_a_norm",
    "self_attn.kv_b_proj": "attn_kv_b",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_experts.gate_proj": "ffn_gate_shexp",
    "mlp.shared_experts.up_proj": "ffn_up_shexp",
    "mlp.shared_experts.down_proj": "ffn_down_shexp",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
_STACKED = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)")


def _gguf_name(hf_name: str) -> str:
    if hf_name.endswith("mlp.gate.e_score_correction_bias"):
        return f"blk.{hf_name.split('.')[2]}.exp_probs_b.bias"
    module, _, suffix = hf_name.rpartition(".")
    if module in _GLOBAL:
        return f"{_GLOBAL[module]}.{suffix}"
    _, _, rest = module.partition("model.layers.")
    layer, _, sub = rest.partition(".")
    return f"blk.{layer}.{_LAYER[sub]}.{suffix}"


def _per_expert(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The checkpoint's tensors with stacked experts (transformers 5) split per expert."""
    out = {}
    for name, t in state.items():
        if hit := _STACKED.fullmatch(name):
            layer, kind = hit.groups()
            for e, part in enumerate(t.float().numpy()):
                if kind == "down_proj":
                    out[f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight"] = part
                else:
                    gate, up = np.split(part, 2)
                    out[f"model.layers.{layer}.mlp.experts.{e}.gate_proj.weight"] = gate
                    out[f"model.layers.{layer}.mlp.experts.{e}.up_proj.weight"] = up
        else:
            out[name] = t.float().numpy()
    return out


def _quantized(name: str, array: np.ndarray, qtype) -> bool:
    return (qtype != gguf.GGMLQuantizationType.F32 and array.ndim >= 2
            and "gate_inp" not in name)


def _round_trip(array: np.ndarray, qtype) -> np.ndarray:
    return gguf.quants.dequantize(gguf.quants.quantize(array, qtype), qtype).reshape(array.shape)


def gguf_tensors(model_dir: Path, legacy_kv_b: bool = False) -> dict[str, np.ndarray]:
    """The file's tensors (float32, before quantization) by llama.cpp name."""
    cfg = json.loads((model_dir / "config.json").read_text())
    heads, nope, v = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    tensors: dict[str, np.ndarray] = {}
    experts: dict[str, dict[int, np.ndarray]] = {}
    for name, array in _per_expert(load_file(str(model_dir / "model.safetensors"))).items():
        if hit := _EXPERT.fullmatch(name):
            layer, expert, part = hit.groups()
            experts.setdefault(f"blk.{layer}.ffn_{part}_exps.weight", {})[int(expert)] = array
        elif name.endswith("kv_b_proj.weight") and not legacy_kv_b:
            kv_b = array.reshape(heads, nope + v, -1)
            layer = name.split(".")[2]
            tensors[f"blk.{layer}.attn_k_b.weight"] = np.ascontiguousarray(
                kv_b[:, :nope].transpose(0, 2, 1))
            tensors[f"blk.{layer}.attn_v_b.weight"] = np.ascontiguousarray(kv_b[:, nope:])
        else:
            tensors[_gguf_name(name)] = array
    for name, parts in experts.items():
        tensors[name] = np.stack([parts[e] for e in range(len(parts))])
    return tensors


def file_values(model_dir: Path, qtype, legacy_kv_b: bool = False) -> dict[str, torch.Tensor]:
    """The source checkpoint's tensors (HF names, per-expert) as the file holds them."""
    cfg = json.loads((model_dir / "config.json").read_text())
    heads, nope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"]
    out = {}
    for name, array in _per_expert(load_file(str(model_dir / "model.safetensors"))).items():
        if name.endswith("kv_b_proj.weight") and not legacy_kv_b and _quantized(name, array,
                                                                                   qtype):
            kv_b = array.reshape(heads, nope + cfg["v_head_dim"], -1)
            k_b = _round_trip(np.ascontiguousarray(kv_b[:, :nope].transpose(0, 2, 1)), qtype)
            v_b = _round_trip(np.ascontiguousarray(kv_b[:, nope:]), qtype)
            array = np.concatenate([k_b.transpose(0, 2, 1), v_b], 1).reshape(array.shape)
        elif _quantized(_gguf_name(name) if "experts" not in name else name, array, qtype):
            array = _round_trip(array, qtype)
        out[name] = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))
    return out


def write_deepseek2_gguf(model_dir: Path, out: Path,
                         qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
                         legacy_kv_b: bool = False) -> Path:
    cfg = json.loads((model_dir / "config.json").read_text())
    w = gguf.GGUFWriter(str(out), "deepseek2")
    r, rope_dim = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type(int(qtype) if qtype != gguf.GGMLQuantizationType.F32 else 0)
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("q_lora_rank"):
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(r)
    if legacy_kv_b:  # older converters: MHA sizes, every head its own KV
        w.add_head_count_kv(cfg["num_attention_heads"])
        w.add_key_length(cfg["qk_nope_head_dim"] + rope_dim)
        w.add_value_length(cfg["v_head_dim"])
    else:
        w.add_head_count_kv(1)
        w.add_key_length(r + rope_dim)
        w.add_value_length(r)
        w.add_key_length_mla(cfg["qk_nope_head_dim"] + rope_dim)
        w.add_value_length_mla(cfg["v_head_dim"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    if cfg.get("norm_topk_prob") and cfg["model_type"] == "deepseek_v3":
        w.add_expert_weights_norm(True)
    if cfg["model_type"] == "deepseek_v3":
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if cfg.get("n_group"):
        w.add_expert_group_count(cfg["n_group"])
        w.add_expert_group_used_count(cfg["topk_group"])
    w.add_rope_dimension_count(rope_dim)
    rope = cfg["rope_parameters"]
    w.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])
    _add_tokenizer(w, model_dir, cfg)
    for name, array in gguf_tensors(model_dir, legacy_kv_b).items():
        if _quantized(name, array, qtype):
            w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
