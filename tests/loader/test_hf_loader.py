"""HF directory loading: a tiny random Llama saved with safetensors round-trips exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from pagedllm.loader import ModelNotFoundError, load_checkpoint

VOCAB = 64
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def _save_tokenizer(model_dir: Path) -> None:
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2} | {f"w{i}": i for i in range(3, VOCAB)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="[UNK]"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)


def _save_model(model_dir: Path, dtype: torch.dtype, shard: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(model_dir, max_shard_size="20KB" if shard else "1GB")
    _save_tokenizer(model_dir)
    return {name: tensor.float() for name, tensor in model.state_dict().items()}


@pytest.mark.parametrize(
    ("dtype", "shard"),
    [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False)],
)
def test_weights_match_state_dict(tmp_path: Path, dtype: torch.dtype, shard: bool) -> None:
    expected = _save_model(tmp_path, dtype, shard)
    assert (tmp_path / "model.safetensors.index.json").exists() == shard

    checkpoint = load_checkpoint(str(tmp_path))

    got = dict(checkpoint.weights())
    assert got.keys() == expected.keys()
    for name, tensor in got.items():
        assert tensor.dtype == torch.float32 and tensor.device.type == "cpu", name
        assert torch.equal(tensor, expected[name]), name
    assert checkpoint.architecture == "LlamaForCausalLM"
    assert checkpoint.config.num_key_value_heads == 2
    assert checkpoint.source == tmp_path


def test_tokenizer_and_chat_template(tmp_path: Path) -> None:
    _save_model(tmp_path, torch.float32, shard=False)
    tokenizer = load_checkpoint(str(tmp_path)).tokenizer
    assert tokenizer("w3 w7 nope").input_ids == [3, 7, 0]
    assert tokenizer.chat_template == CHAT_TEMPLATE


def test_weights_are_lazy_and_repeatable(tmp_path: Path) -> None:
    _save_model(tmp_path, torch.float32, shard=True)
    checkpoint = load_checkpoint(str(tmp_path))
    first = next(checkpoint.weights())
    names = [name for name, _ in checkpoint.weights()]
    assert first[0] == names[0]
    assert len(names) == len(set(names))


def test_directory_without_safetensors(tmp_path: Path) -> None:
    _save_model(tmp_path, torch.float32, shard=False)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelNotFoundError, match=r"no \*\.safetensors files"):
        load_checkpoint(str(tmp_path))
