"""Write a tiny HF checkpoint (tests/conftest.py's) as a GGUF file the way llama.cpp's
converter lays out qwen2 / qwen3 models: `<arch>.*` metadata, the byte-level BPE vocabulary
as a "gpt2" tokenizer with its merges, llama.cpp tensor names, q/k rows unpermuted (NEOX
RoPE), matrices in `qtype` (gguf-py's quantizer) and norms / biases in F32."""

from __future__ import annotations

import json
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
}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def gguf_name(hf_name: str) -> str:
    module, _, suffix = hf_name.rpartition(".")
    if module in _GLOBAL:
        return f"{_GLOBAL[module]}.{suffix}"
    _, _, rest = module.partition("model.layers.")
    layer, _, sub = rest.partition(".")
    return f"blk.{layer}.{_LAYER[sub]}.{suffix}"


def write_gguf(
    model_dir: Path,
    out: Path,
    arch: str,
    qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
) -> Path:
    cfg = json.loads((model_dir / "config.json").read_text())
    writer = gguf.GGUFWriter(str(out), arch)
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

    with safe_open(str(model_dir / "model.safetensors"), framework="np") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open is not a Mapping
            array = f.get_tensor(name).astype(np.float32)
            if array.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
                writer.add_tensor(
                    gguf_name(name), gguf.quants.quantize(array, qtype), raw_dtype=qtype
                )
            else:
                writer.add_tensor(gguf_name(name), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
