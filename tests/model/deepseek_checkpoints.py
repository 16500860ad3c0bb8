"""Tiny random DeepSeek-V2 / V3 checkpoints, saved by HF transformers (`save_pretrained`).

Both: 3 layers of hidden 64, 4 heads (qk_nope 16, qk_rope 8, v 16), kv_lora_rank 24, 8 routed
experts of width 32, top-3, 2 shared experts, layer 0 dense (first_k_dense_replace = 1), YaRN
(factor 4 over an original 256 positions, mscale = mscale_all_dim = 0.707: the attention
scale carries mscale^2), routed_scaling_factor 2.5.

    v3      q_lora_rank 32, sigmoid router with e_score_correction_bias, 4 groups of 2
            experts, top-2 groups (noaux_tc), renormalized
    v2      q_lora_rank 32, softmax router, group_limited_greedy (4 groups, top-2)
    v2lite  q_lora_rank None (q_proj), plain greedy top-k

Latent KV per token: 3 layers x (24 + 8) x 4 bytes = 384 bytes in fp32 (`LATENT_BYTES`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import TINY_VOCAB

LATENT_BYTES = 3 * (24 + 8) * 4

COMMON = dict(
    vocab_size=TINY_VOCAB,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=2,
    n_routed_experts=8,
    num_experts_per_tok=3,
    routed_scaling_factor=2.5,
    kv_lora_rank=24,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    first_k_dense_replace=1,
    max_position_embeddings=1024,
    rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                         original_max_position_embeddings=256, mscale=0.707,
                         mscale_all_dim=0.707, beta_fast=32, beta_slow=1),
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=None,
    tie_word_embeddings=False,
    rms_norm_eps=1e-6,
)

VARIANTS = {
    "v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
           dict(q_lora_rank=32, n_group=4, topk_group=2, norm_topk_prob=True)),
    "v2": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
           dict(q_lora_rank=32, n_group=4, topk_group=2, topk_method="group_limited_greedy")),
    "v2lite": ("DeepseekV2Config", "DeepseekV2ForCausalLM",
               dict(q_lora_rank=None, topk_method="greedy")),
}


def make_deepseek_checkpoint(path: Path, variant: str, tokenizer, seed: int = 0,
                             weight_scale: float = 6.0, **overrides) -> Path:
    """Save a random tiny DeepSeek `variant` to `path`: matrices x `weight_scale` (greedy is
    decisive), norm weights jittered, V3's expert bias random (it must steer the choice);
    `overrides` change config fields."""
    import transformers

    cfg_name, model_name, extra = VARIANTS[variant]
    cfg = getattr(transformers, cfg_name)(**{**COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
            elif p.dim() > 1:
                p.normal_(0.0, 0.02).mul_(weight_scale)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
