"""olmo2 and glm4 GGUF files (tests/loader/gguf_writer.py: llama.cpp's layouts; OLMo 2's
post-norms and all-head q/k norms, GLM-4's sandwich norms, fused gate/up ``ffn_up``, q/k/v
biases and half-dimension interleaved RoPE) of tiny random checkpoints, loaded by pagedllm:
equal greedy tokens with HF transformers.

HF transformers' GGUF loader has no olmo2 or glm4 mapping, so the reference is HF on the
safetensors checkpoint each file was written from: the source itself for F32 files; for Q8_0
files, the source with every matrix through gguf-py's Q8_0 round trip (the values the file
holds). Q8_0 loads both kept in blocks (the default; GLM-4's q/k rows reordered while
building them) and dequantized (``quantization="none"``)."""

from __future__ import annotations

import gguf
import pytest

from pagedllm.loader import load_checkpoint
from pagedllm.loader.cache import CACHE_DIR_ENV
from tests.loader.gguf_writer import q8_0_reference, write_gguf
from tests.model.family_checkpoints import make_family_checkpoint
from tests.model.test_vs_hf import PROMPTS, assert_matches_hf

Q8_0 = gguf.GGMLQuantizationType.Q8_0
ARCHES = ("olmo2", "glm4")
TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_tokenizer):
    """arch -> kind -> (GGUF path, HF reference dir). GLM-4: head_dim 16, rotary 8; untied.
    OLMo 2: tied embeddings (no ``output`` tensor)."""
    root = tmp_path_factory.mktemp("olmo2_glm4_gguf")
    out = {}
    for arch, extra in (("olmo2", dict(tie_word_embeddings=True)), ("glm4", {})):
        src = make_family_checkpoint(root / arch, arch, tiny_tokenizer, seed=7, **extra)
        out[arch] = {
            "f32": (write_gguf(src, root / f"{arch}-f32.gguf", arch, chat_template=TEMPLATE),
                    src),
            "q8_0": (write_gguf(src, root / f"{arch}-q8_0.gguf", arch, Q8_0),
                     q8_0_reference(src, root / f"{arch}-q8_0-ref")),
        }
    return out


def test_tokenizer_and_chat_template_from_the_file(files, tmp_path, tiny_tokenizer) -> None:
    """transformers' GGUF support has no olmo2 / glm4: the tokenizer is built from the file's
    tokenizer.ggml.* alone, and encodes as the checkpoint's own; the chat template is the
    file's. The same again from the conversion cache."""
    text = "Hello there, how are you? 123 tokens"
    for arch in ARCHES:
        for _ in range(2):  # converted, then cached
            tok = load_checkpoint(str(files[arch]["f32"][0]), cache_dir=tmp_path).tokenizer
            assert tok.encode(text, add_special_tokens=False) == tiny_tokenizer.encode(
                text, add_special_tokens=False)
            chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
            assert chat == "<|user|>hi"


def test_config_from_metadata(files, tmp_path) -> None:
    olmo2 = load_checkpoint(str(files["olmo2"]["f32"][0]), cache_dir=tmp_path).config
    assert olmo2.architectures == ["Olmo2ForCausalLM"] and olmo2.tie_word_embeddings
    assert (olmo2.num_attention_heads, olmo2.num_key_value_heads) == (4, 2)
    glm4 = load_checkpoint(str(files["glm4"]["f32"][0]), cache_dir=tmp_path).config
    assert glm4.architectures == ["Glm4ForCausalLM"] and not glm4.tie_word_embeddings
    assert glm4.head_dim == 16 and glm4.rope_parameters["partial_rotary_factor"] == 0.5
    assert glm4.attention_bias and glm4.qk_rows_half_rotation
    names = {n for n, _ in load_checkpoint(str(files["glm4"]["f32"][0]), cache_dir=tmp_path,
                                           quantization="none").weights()}
    assert {"model.layers.1.mlp.gate_up_proj.weight",
            "model.layers.1.post_mlp_layernorm.weight",
            "model.layers.1.self_attn.q_proj.bias"} <= names


@pytest.mark.parametrize(("kind", "quantization"),
                         [("f32", None), ("q8_0", None), ("q8_0", "none")])
@pytest.mark.parametrize("arch", ARCHES)
def test_gguf_matches_hf(arch, kind, quantization, files, tmp_path, monkeypatch, make_llm,
                         hf_reference) -> None:
    path, reference = files[arch][kind]
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    llm = make_llm(path, max_model_len=512, int8_activations=False, quantization=quantization)
    blocks = [m for m in llm.llm_engine.model.modules()
              if type(m).__name__ == "Linear" and type(m.method).__name__ == "GGUFWeight"]
    assert bool(blocks) == (kind == "q8_0" and quantization is None)
    assert_matches_hf(llm, reference, hf_reference, PROMPTS)
