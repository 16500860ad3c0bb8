"""Vision-language checkpoints (`Gemma3ForConditionalGeneration`,
`Mistral3ForConditionalGeneration`) served as their language model: greedy tokens equal HF's
full vision-language model on text-only prompts; the vision tower is never read; the plan
reads the text config."""

from __future__ import annotations

import logging

import pytest
import torch

from pagedllm.loader import multimodal_text
from pagedllm.memory_plan import load_config, parameter_counts
from tests.model.test_vs_hf import PROMPTS, assert_matches_hf

TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=512,
    max_position_embeddings=1024,
    bos_token_id=0,
    eos_token_id=1,
    pad_token_id=None,
    rms_norm_eps=1e-6,
)
VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    image_size=28,
    patch_size=14,
)


def _save(path, tokenizer, family: str, scale: float):
    import transformers

    if family == "gemma3":
        config = transformers.Gemma3Config(
            text_config=dict(
                TEXT,
                layer_types=["sliding_attention", "full_attention"],
                sliding_window=16,
                query_pre_attn_scalar=24,
            ),
            vision_config=VISION,
            mm_tokens_per_image=4,
        )
        model_cls = transformers.Gemma3ForConditionalGeneration
    else:
        config = transformers.Mistral3Config(
            text_config=dict(TEXT, model_type="mistral", tie_word_embeddings=False),
            vision_config=dict(VISION, model_type="pixtral", head_dim=16),
            tie_word_embeddings=False,  # HF ties by the top-level flag
        )
        model_cls = transformers.Mistral3ForConditionalGeneration
    torch.manual_seed(7)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name and p.dim() > 1:
                p.mul_(scale)
            elif "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory, tiny_tokenizer):
    return {
        "gemma3": _save(tmp_path_factory.mktemp("gemma3_vlm"), tiny_tokenizer, "gemma3", 2.0),
        "mistral3": _save(tmp_path_factory.mktemp("mistral3_vlm"), tiny_tokenizer, "mistral3", 8.0),
    }


@pytest.mark.parametrize("family", ["gemma3", "mistral3"])
def test_language_model_matches_hf_vlm(family, vlm_dirs, make_llm, hf_reference, caplog) -> None:
    import transformers

    model_dir = vlm_dirs[family]
    hf_reference.register(
        model_dir,
        transformers.AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32),
    )
    caplog.set_level(logging.INFO, logger="pagedllm.loader.multimodal_text")
    llm = make_llm(model_dir, max_num_batched_tokens=32)
    assert any("the vision tower is not loaded" in r.getMessage() for r in caplog.records)
    model = llm.llm_engine.model
    assert (
        type(model).__name__
        == {"gemma3": "Gemma3ForCausalLM", "mistral3": "LlamaForCausalLM"}[family]
    )
    assert model.tie_word_embeddings == (family == "gemma3")
    assert_matches_hf(llm, model_dir, hf_reference, PROMPTS)


def test_vision_tensors_are_never_read(vlm_dirs, monkeypatch) -> None:
    files = [vlm_dirs["mistral3"] / "model.safetensors"]
    names = multimodal_text.weight_names(files)
    assert any(n.startswith("vision_tower.") for n in names)
    text = dict(multimodal_text.iter_text_weights(files))
    assert "lm_head.weight" in text and "model.embed_tokens.weight" in text
    assert not any("vision" in n or "projector" in n for n in text)
    assert len(text) == sum(multimodal_text.text_weight_name(n) is not None for n in names)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("language_model.model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
        ("model.language_model.norm.weight", "model.norm.weight"),
        ("language_model.lm_head.weight", "lm_head.weight"),
        ("lm_head.weight", "lm_head.weight"),
        ("vision_tower.transformer.layers.0.attention.q_proj.weight", None),
        ("model.multi_modal_projector.linear_1.weight", None),
    ],
)
def test_text_weight_names(name, text) -> None:
    assert multimodal_text.text_weight_name(name) == text


def test_plan_reads_the_text_config(vlm_dirs, tiny_tokenizer) -> None:
    import transformers

    cfg = load_config(str(vlm_dirs["mistral3"]))
    assert cfg.architectures == ["MistralForCausalLM"] and cfg.num_hidden_layers == 2
    hf = transformers.AutoModelForImageTextToText.from_pretrained(vlm_dirs["mistral3"])
    language = sum(
        p.numel() for n, p in hf.named_parameters() if "vision" not in n and "projector" not in n
    )
    assert parameter_counts(cfg)[0] == language
