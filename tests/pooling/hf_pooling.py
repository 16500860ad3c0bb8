"""HF references for the pooling tests: tiny random sequence-classification checkpoints
(transformers' LlamaForSequenceClassification) and hidden states / logits pooled as the
engine pools them."""

from __future__ import annotations

from pathlib import Path

import torch


def make_seq_cls_checkpoint(path: Path, tokenizer, num_labels: int, seed: int = 5) -> Path:
    """A random tiny LlamaForSequenceClassification (weights x8, as the causal fixtures)."""
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
        num_labels=num_labels,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForSequenceClassification(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name and p.dim() > 1:
                p.mul_(8.0)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@torch.inference_mode()
def hf_hidden(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    """The last hidden states (after the final norm) of HF's decoder, [T, H]."""
    import transformers

    model = _cached(model_dir, transformers.AutoModelForCausalLM)
    return model.model(torch.tensor([token_ids])).last_hidden_state[0].float()


@torch.inference_mode()
def hf_seq_cls_logits(model_dir: Path, token_ids: list[int]) -> torch.Tensor:
    """HF's sequence-classification logits of one unpadded sequence, [num_labels]."""
    import transformers

    model = _cached(model_dir, transformers.AutoModelForSequenceClassification)
    return model(torch.tensor([token_ids])).logits[0].float()


_MODELS: dict[tuple[str, str], torch.nn.Module] = {}


def _cached(model_dir: Path, auto_cls) -> torch.nn.Module:
    key = (str(model_dir), auto_cls.__name__)
    if key not in _MODELS:
        _MODELS[key] = auto_cls.from_pretrained(model_dir, dtype=torch.float32).eval()
    return _MODELS[key]
