"""GGUF loading: names, q/k un-permutation, and equality with transformers' GGUF loader."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from pagedllm.loader import CACHE_DIR_ENV, Checkpoint, load_checkpoint
from pagedllm.loader.gguf_loader import hf_tensor_name, reverse_permute

TEXTS = [
    "Hello world",
    " leading space",
    "naïve café 123\n\ttabs",
    "<|im_start|>user\nhi<|im_end|>",
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def _llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py ``LlamaModel.permute`` (the forward direction)."""
    half = weights.shape[0] // n_head // 2
    return (
        weights.reshape(n_head, 2, half, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)
    )


@pytest.mark.parametrize("shape", [(4 * 8, 6), (4 * 8,)])
def test_reverse_permute_inverts_llama_cpp(shape: tuple[int, ...]) -> None:
    weights = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    assert np.array_equal(reverse_permute(_llama_cpp_permute(weights, 4), 4), weights)


def test_tensor_names() -> None:
    assert hf_tensor_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_tensor_name("output_norm.weight") == "model.norm.weight"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    assert hf_tensor_name("blk.12.attn_q.weight") == "model.layers.12.self_attn.q_proj.weight"
    assert hf_tensor_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj.weight"
    assert hf_tensor_name("blk.3.ffn_down.weight") == "model.layers.3.mlp.down_proj.weight"
    assert (
        hf_tensor_name("blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    )
    assert hf_tensor_name("blk.3.attn_norm.weight") == "model.layers.3.input_layernorm.weight"
    assert hf_tensor_name("rope_freqs.weight") is None


@pytest.mark.slow
def test_config_matches_transformers(gguf_checkpoint: Checkpoint, smollm2_gguf: Path) -> None:
    expected = transformers.AutoConfig.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, local_files_only=True
    )
    config = gguf_checkpoint.config
    assert config.architectures == ["LlamaForCausalLM"]
    for field in [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "vocab_size",
        "tie_word_embeddings",
        "max_position_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ]:
        assert getattr(config, field) == getattr(expected, field), field
    assert config.rope_parameters["rope_theta"] == expected.rope_parameters["rope_theta"]


@pytest.mark.slow
def test_tokenizer_matches_transformers(
    gguf_checkpoint: Checkpoint, hf_gguf_tokenizer: transformers.PreTrainedTokenizerBase
) -> None:
    tokenizer = gguf_checkpoint.tokenizer
    for text in TEXTS:
        assert tokenizer(text).input_ids == hf_gguf_tokenizer(text).input_ids, text
    assert tokenizer.chat_template and tokenizer.chat_template == hf_gguf_tokenizer.chat_template
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    expected = hf_gguf_tokenizer.apply_chat_template(
        CHAT, add_generation_prompt=True, tokenize=False
    )
    assert prompt == expected and prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer(prompt).input_ids == hf_gguf_tokenizer(expected).input_ids
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)


@pytest.mark.slow
def test_second_load_uses_cache(
    smollm2_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    load_checkpoint(str(smollm2_gguf), quantization="none")
    assert len(list((tmp_path / "gguf").iterdir())) == 1

    start = time.perf_counter()
    checkpoint = load_checkpoint(str(smollm2_gguf), quantization="none")
    count = sum(1 for _ in checkpoint.weights())
    elapsed = time.perf_counter() - start
    assert count == 272
    assert elapsed < 3.0, f"cached load took {elapsed:.2f}s"
    assert checkpoint.source == smollm2_gguf


@pytest.fixture(scope="module")
def hf_gguf_state_dict(smollm2_gguf: Path) -> dict[str, torch.Tensor]:
    """transformers' dequantized weights of the same GGUF file (~40 s)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    return model.state_dict()


@pytest.mark.slow
def test_weights_match_transformers(
    gguf_checkpoint: Checkpoint, hf_gguf_state_dict: dict[str, torch.Tensor]
) -> None:
    got = dict(gguf_checkpoint.weights())
    # SmolLM2 ties lm_head to the embedding, and the GGUF has no output.weight.
    assert set(got) == set(hf_gguf_state_dict) - {"lm_head.weight"}
    for name, tensor in got.items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, hf_gguf_state_dict[name]), name
