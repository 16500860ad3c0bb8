"""Tiny random checkpoints of the families beyond tests/conftest.py's, saved by HF
transformers with `save_pretrained` (MoE experts as per-expert tensors, as on the Hub).

All have 2 layers of hidden 64 and 2 KV heads of 16 (512 KV bytes per token in fp32, as the
conftest's tiny models).

MOE_FAMILIES: 4 experts with top-2 routing; Qwen2-MoE has its sigmoid-gated shared expert and
one dense layer (`mlp_only_layers`), Qwen3-MoE renormalizes its top-k (`norm_topk_prob`),
OLMoE clips q/k/v at 2 (which the normed q, k and the v rows exceed).
DENSE_FAMILIES: OLMo 2 (post-norms, q/k norms over all heads), Granite 3 (all four
multipliers away from 1; untied: with tied embeddings the x12 embedding makes the tiny model
repeat its input token), SmolLM3 (layer 1 without RoPE), Gemma 2 (a 16-token sliding
window on layer 0, attention and final logit soft-capping that bite), Phi-3 (fused qkv / gate-up
tensors; no sliding window: one on every layer turns prefix caching off), GLM-4 (interleaved
partial RoPE, sandwich norms, q/k/v biases).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import TINY_VOCAB

COMMON = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=TINY_VOCAB,
    max_position_embeddings=1024,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=None,
    tie_word_embeddings=False,
    rms_norm_eps=1e-6,
    num_experts_per_tok=2,
)

MOE_FAMILIES = {
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(intermediate_size=96, num_local_experts=4),
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=48,
            num_experts=4,
            shared_expert_intermediate_size=80,
            mlp_only_layers=[1],
            norm_topk_prob=False,
        ),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            intermediate_size=128,
            moe_intermediate_size=48,
            num_experts=4,
            head_dim=16,
            norm_topk_prob=True,
        ),
    ),
    "olmoe": (
        "OlmoeConfig",
        "OlmoeForCausalLM",
        dict(intermediate_size=48, num_experts=4, clip_qkv=2.0, norm_topk_prob=False),
    ),
}


DENSE_FAMILIES = {
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(intermediate_size=128)),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        dict(
            intermediate_size=128,
            embedding_multiplier=12.0,
            residual_multiplier=0.22,
            attention_multiplier=0.1,
            logits_scaling=4.0,
        ),
    ),
    "smollm3": (
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        dict(intermediate_size=128, no_rope_layers=[1, 0]),
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            intermediate_size=128,
            head_dim=16,
            layer_types=["sliding_attention", "full_attention"],
            sliding_window=16,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=3.0,
            final_logit_softcapping=8.0,
        ),
    ),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(intermediate_size=128, sliding_window=None),
    ),
    "glm4": (
        "Glm4Config",
        "Glm4ForCausalLM",
        dict(intermediate_size=128, head_dim=16, attention_bias=True),
    ),
}
FAMILIES = {**MOE_FAMILIES, **DENSE_FAMILIES}
# Matrices are scaled up so greedy decoding is decisive; Gemma's sqrt(hidden) embedding scale
# and post-norms make x8 models (and tied embeddings) repeat one token.
WEIGHT_SCALE = {"gemma2": 4.0}


def make_family_checkpoint(
    path: Path,
    family: str,
    tokenizer,
    seed: int = 0,
    weight_scale: float | None = None,
    norm_jitter: float = 0.3,
    **overrides,
) -> Path:
    """Save a random tiny `family` model to `path`: matrices x `weight_scale` (so greedy
    is decisive), norm weights jittered by `norm_jitter`."""
    import transformers

    cfg_name, model_name, extra = FAMILIES[family]
    weight_scale = weight_scale or WEIGHT_SCALE.get(family, 8.0)
    cfg = getattr(transformers, cfg_name)(**{**COMMON, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(weight_scale if p.dim() > 1 else 1.0)
            elif norm_jitter:
                p.add_(norm_jitter * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
