"""Shared fixtures: tiny random HF checkpoints (Llama, Qwen2, Mistral) with a small trained
byte-level BPE tokenizer, written to disk so the engine loads them like real models."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

TINY_VOCAB = 512


def _train_tokenizer():
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(topics.values())[:20], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant:{% endif %}")
    return fast


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return _train_tokenizer()


def make_tiny_checkpoint(path: Path, arch: str, tokenizer, seed: int = 0, **overrides) -> Path:
    """Save a random tiny model of architecture `arch` (llama | qwen2 | mistral) to `path`."""
    import transformers

    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=TINY_VOCAB,
                  max_position_embeddings=1024, bos_token_id=0, eos_token_id=1,
                  tie_word_embeddings=False, rms_norm_eps=1e-6)
    common.update(overrides)
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[arch]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**common)).eval()
    # Random init has tiny weights -> near-uniform logits; scale up so greedy is decisive.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(8.0 if p.dim() > 1 else 1.0)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama", tiny_tokenizer)


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level(logging.WARNING)
    yield
