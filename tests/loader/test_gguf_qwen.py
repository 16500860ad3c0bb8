"""qwen2 / qwen3 GGUF files (written by tests/loader/gguf_writer.py from tiny random HF
checkpoints, matrices in Q8_0) loaded by pagedllm, kept quantized or dequantized, and by HF
transformers' GGUF loader: equal greedy tokens for 8 prompts of mixed lengths."""

from __future__ import annotations

import gguf
import pytest
import torch

from pagedllm.loader import load_checkpoint
from pagedllm.loader.cache import CACHE_DIR_ENV
from tests.conftest import make_tiny_checkpoint
from tests.loader.gguf_writer import write_gguf
from tests.model.test_vs_hf import PROMPTS, assert_matches_hf

Q8_0 = gguf.GGMLQuantizationType.Q8_0


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory, tiny_tokenizer):
    """qwen2: q/k/v biases, tied embeddings. qwen3: q/k norms, its own head size (128,
    which HF's GGUF config mapping assumes), untied."""
    root = tmp_path_factory.mktemp("gguf_qwen")
    qwen2 = make_tiny_checkpoint(
        root / "qwen2", "qwen2", tiny_tokenizer, seed=1, tie_word_embeddings=True
    )
    qwen3 = make_tiny_checkpoint(
        root / "qwen3",
        "qwen3",
        tiny_tokenizer,
        seed=3,
        hidden_size=256,
        intermediate_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=128,
        norm_jitter=0.3,
        weight_scale=4.0,
    )
    return {
        "qwen2": write_gguf(qwen2, root / "qwen2-q8_0.gguf", "qwen2", Q8_0),
        "qwen3": write_gguf(qwen3, root / "qwen3-q8_0.gguf", "qwen3", Q8_0),
    }


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("quantization", [None, "none"])
@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_greedy_matches_hf_gguf_loader(
    arch, quantization, gguf_files, private_cache, make_llm, hf_reference
) -> None:
    import transformers

    path = gguf_files[arch]
    hf_reference.register(
        path,
        transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ),
    )
    llm = make_llm(path, quantization=quantization, int8_activations=False, max_model_len=512)
    model = llm.llm_engine.model
    quantized = [
        m
        for m in model.modules()
        if type(m).__name__ == "Linear" and type(m.method).__name__ == "GGUFWeight"
    ]
    assert bool(quantized) == (quantization is None)  # default: Q8_0 kept as blocks
    assert_matches_hf(llm, path, hf_reference, PROMPTS)


def test_config_from_metadata(gguf_files, tmp_path) -> None:
    qwen2 = load_checkpoint(str(gguf_files["qwen2"]), cache_dir=tmp_path).config
    assert qwen2.architectures == ["Qwen2ForCausalLM"] and qwen2.tie_word_embeddings
    assert (qwen2.num_attention_heads, qwen2.num_key_value_heads) == (4, 2)
    qwen3 = load_checkpoint(str(gguf_files["qwen3"]), cache_dir=tmp_path).config
    assert qwen3.architectures == ["Qwen3ForCausalLM"] and not qwen3.tie_word_embeddings
    assert (qwen3.head_dim, qwen3.hidden_size, qwen3.num_attention_heads) == (128, 256, 2)
    names = {
        n
        for n, _ in load_checkpoint(
            str(gguf_files["qwen3"]), cache_dir=tmp_path, quantization="none"
        ).weights()
    }
    assert "model.layers.1.self_attn.k_norm.weight" in names


def test_unknown_architecture_is_refused(tmp_path) -> None:
    from pagedllm.loader.errors import UnsupportedModelError

    path = tmp_path / "x.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_tensor("token_embd.weight", torch.zeros(4, 4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="'mamba' is not supported .*'qwen3'"):
        load_checkpoint(str(path), cache_dir=tmp_path / "cache")


def _meta(values):
    def meta(key, default=KeyError):
        if key in values:
            return values[key]
        if default is KeyError:
            raise KeyError(key)
        return default

    return meta


BASE = {
    "qwen2.attention.head_count": 4,
    "qwen2.embedding_length": 64,
    "qwen2.feed_forward_length": 128,
    "qwen2.block_count": 2,
    "qwen2.context_length": 4096,
    "qwen2.attention.layer_norm_rms_epsilon": 1e-6,
    "qwen2.rope.freq_base": 1e6,
}
SHAPES = {"token_embd.weight": (512, 64), "blk.0.attn_q.bias": (64,)}


def test_yarn_rope_scaling_metadata() -> None:
    from pagedllm.loader import gguf_qwen
    from pagedllm.model.layers.rope_scaling import rope_max_len

    config = gguf_qwen.config(
        "qwen2",
        _meta(
            {
                **BASE,
                "qwen2.rope.scaling.type": "yarn",
                "qwen2.rope.scaling.factor": 4.0,
                "qwen2.rope.scaling.original_context_length": 4096,
            }
        ),
        SHAPES,
    )
    assert config.rope_parameters == {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "factor": 4.0,
        "original_max_position_embeddings": 4096,
    }
    assert rope_max_len(config)[0] == 16384
    assert config.tie_word_embeddings


def test_unsupported_rope_scaling_metadata_is_refused() -> None:
    from pagedllm.loader import gguf_qwen
    from pagedllm.loader.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="rope scaling 'longrope'"):
        gguf_qwen.config("qwen2", _meta({**BASE, "qwen2.rope.scaling.type": "longrope"}), SHAPES)
