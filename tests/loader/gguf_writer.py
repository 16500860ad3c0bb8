"""Write a tiny HF checkpoint (tests/conftest.py's) as a GGUF file the way llama.cpp's
converter lays out qwen2 / qwen3 / qwen2moe / qwen3moe, gemma2, phi3, olmo2 and glm4 models and
Mixtral (as `llama`):
`<arch>.*` metadata, the byte-level BPE vocabulary as a "gpt2" tokenizer with its merges,
llama.cpp tensor names, q/k rows unpermuted for NEOX RoPE (qwen) or in llama.cpp's
interleaved order (llama), each layer's experts stacked ([E, N, K]), matrices in `qtype`
(gguf-py's quantizer) and norms / biases / routers in F32."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import numpy as np
from safetensors import safe_open

_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate": "ffn_gate_inp",
    "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
    "mlp.shared_expert.up_proj": "ffn_up_shexp",
    "mlp.shared_expert.down_proj": "ffn_down_shexp",
    "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    "block_sparse_moe.gate": "ffn_gate_inp",
    "self_attn.qkv_proj": "attn_qkv",  # phi3's fused tensors
    "mlp.gate_up_proj": "ffn_up",
}
# Gemma's norms around both sublayers (its ffn_norm is the pre-feed-forward norm)
_GEMMA_LAYER = {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
# OLMo 2: post-norms only; GLM-4: sandwich norms and the fused gate/up as `ffn_up`
_OLMO2_LAYER = {
    "post_attention_layernorm": "post_attention_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
_GLM4_LAYER = {
    "post_self_attn_layernorm": "post_attention_norm",
    "post_attention_layernorm": "ffn_norm",
    "post_mlp_layernorm": "post_ffw_norm",
}
_ARCH_LAYER = {"gemma2": _GEMMA_LAYER, "gemma3": _GEMMA_LAYER, "olmo2": _OLMO2_LAYER,
               "glm4": _GLM4_LAYER}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_EXPERT = re.compile(
    r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\."
    r"(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight"
)
_PART = {
    "gate_proj": "gate",
    "w1": "gate",
    "up_proj": "up",
    "w3": "up",
    "down_proj": "down",
    "w2": "down",
}


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order for its interleaved RoPE (convert_hf_to_gguf `permute`)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    module, _, suffix = hf_name.rpartition(".")
    if module in _GLOBAL:
        return f"{_GLOBAL[module]}.{suffix}"
    _, _, rest = module.partition("model.layers.")
    layer, _, sub = rest.partition(".")
    names = {**_LAYER, **_ARCH_LAYER.get(arch, {})}
    return f"blk.{layer}.{names[sub]}.{suffix}"


def llama3_rope_factors(cfg: dict) -> np.ndarray:
    """llama.cpp's `rope_freqs` for a llama3-scaled model (convert_hf_to_gguf.py's
    LlamaModel.generate_extra_tensors): one divisor per rotary frequency."""
    rope = cfg["rope_parameters"]
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _add_metadata(writer: gguf.GGUFWriter, cfg: dict, arch: str, qtype) -> None:
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_file_type(int(qtype) if qtype != gguf.GGMLQuantizationType.F32 else 0)
    if arch.endswith("moe") or "num_local_experts" in cfg:
        writer.add_expert_count(cfg.get("num_experts") or cfg["num_local_experts"])
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
    if arch.endswith("moe"):
        writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        if cfg.get("shared_expert_intermediate_size"):
            writer.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    rope = cfg["rope_parameters"]
    if arch == "glm4":  # convert_hf_to_gguf's Glm4Model
        writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 0.5)))
    if arch == "phi3":
        writer.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
        if rope.get("rope_type") == "longrope":
            writer.add_rope_scaling_orig_ctx_len(cfg["original_max_position_embeddings"])
    if arch == "gemma2":
        writer.add_sliding_window(cfg["sliding_window"])
        writer.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])


def _add_tokenizer(writer: gguf.GGUFWriter, model_dir: Path, cfg: dict) -> None:
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["content"] for t in tok["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t, _ in vocab]
    )
    writer.add_token_merges(
        [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    )
    writer.add_bos_token_id(cfg["bos_token_id"])
    writer.add_eos_token_id(cfg["eos_token_id"])
    writer.add_add_bos_token(False)


def write_gguf(
    model_dir: Path,
    out: Path,
    arch: str,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
    chat_template: str | None = None,
) -> Path:
    cfg = json.loads((model_dir / "config.json").read_text())
    writer = gguf.GGUFWriter(str(out), arch)
    _add_metadata(writer, cfg, arch, qtype)
    _add_tokenizer(writer, model_dir, cfg)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    tensors: dict[str, np.ndarray] = {}
    experts: dict[str, dict[int, np.ndarray]] = {}
    with safe_open(str(model_dir / "model.safetensors"), framework="np") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
            array = f.get_tensor(name).astype(np.float32)
            if hit := _EXPERT.fullmatch(name):
                layer, expert, part = hit.groups()
                key = f"blk.{layer}.ffn_{_PART[part]}_exps.weight"
                experts.setdefault(key, {})[int(expert)] = array
                continue
            if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                heads = cfg["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
                array = llama_permute(array, heads)
            if arch.startswith("gemma") and name.endswith("norm.weight"):
                array = array + 1.0  # llama.cpp multiplies by the stored weight: 1 + w
            tensors[gguf_name(name, arch)] = array
    for name, parts in experts.items():
        tensors[name] = np.stack([parts[e] for e in range(len(parts))])
    for name, array in tensors.items():
        if array.ndim >= 2 and "gate_inp" not in name and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, array)
    if arch == "llama" and cfg["rope_parameters"].get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
    if arch == "phi3" and cfg["rope_parameters"].get("rope_type") == "longrope":
        for which in ("short", "long"):
            factors = np.array(cfg["rope_parameters"][f"{which}_factor"], dtype=np.float32)
            writer.add_tensor(f"rope_factors_{which}.weight", factors)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def q8_0_reference(src: Path, ref: Path) -> Path:
    """A copy of the HF checkpoint `src` at `ref` with every matrix through gguf-py's Q8_0
    round trip: the values a Q8_0 file written from `src` holds (the HF reference for it)."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    q8_0 = gguf.GGMLQuantizationType.Q8_0
    ref.mkdir()
    for f in src.iterdir():
        shutil.copy(f, ref / f.name)

    def round_trip(t: torch.Tensor) -> torch.Tensor:
        a = t.float().numpy()
        q = gguf.quants.dequantize(gguf.quants.quantize(a, q8_0), q8_0)
        return torch.from_numpy(q.reshape(a.shape).astype(np.float32))

    tensors = load_file(str(src / "model.safetensors"))
    save_file({n: round_trip(t) if t.dim() == 2 else t for n, t in tensors.items()},
              str(ref / "model.safetensors"))
    return ref
