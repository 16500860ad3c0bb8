"""Shared fixtures: tiny random HF checkpoints (Llama, Qwen2, Mistral) with a small trained
byte-level BPE tokenizer, written to disk so the engine loads them like real models."""

from __future__ import annotations

import inspect
import logging
import os
import platform
from pathlib import Path

import pytest
import torch

from pagedllm.kernels import cpu_ops

TINY_VOCAB = 512

# The C++ CPU kernels build on every Linux machine whose target has what they need (x86-64
# with AVX2, FMA and F16C: cpu_ops.target_lacks) and a C++ compiler, so there a build failure
# must fail the run, not turn the kernel tests into skips (cpu_ops.py).
# PAGEDLLM_REQUIRE_CPU_KERNELS=0 or PAGEDLLM_NO_CPU_KERNELS=1 opt out explicitly.
if platform.system() == "Linux" and cpu_ops.target_lacks() == []:
    os.environ.setdefault("PAGEDLLM_REQUIRE_CPU_KERNELS", "1")

# `--dtype auto` on a CPU with bf16 matrix instructions means bf16 linear weights
# (config/dtype.py); the suite's ~2000 comparisons with HF fp32 at 1e-4 test the fp32 path on
# every CPU, so 'auto' is pinned to float32 here. Tests of the bf16 path set dtype themselves
# (or unset the variable).
os.environ.setdefault("PAGEDLLM_AUTO_DTYPE", "float32")

# Without a GPU the Triton kernels (pagedllm/kernels/triton/) run in Triton's interpreter on
# CPU tensors; the variable must be set before triton is first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _train_tokenizer(vocab_size: int = TINY_VOCAB):
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>"],
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


def make_tiny_checkpoint(path: Path, arch: str, tokenizer, seed: int = 0,
                         norm_jitter: float = 0.0, weight_scale: float = 8.0,
                         **overrides) -> Path:
    """Save a random tiny model of architecture `arch` (llama | qwen2 | mistral | qwen3 |
    gemma3) to `path`; matrices are scaled by `weight_scale`, `norm_jitter` adds noise of
    that size to the norm weights."""
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
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
    }[arch]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**common)).eval()
    # Random init has tiny weights -> near-uniform logits; scale up so greedy is decisive.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(weight_scale if p.dim() > 1 else 1.0)
            elif norm_jitter:
                p.add_(norm_jitter * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama", tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """Qwen2: q/k/v biases, tied embeddings."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("qwen2"), "qwen2", tiny_tokenizer,
                                seed=1, tie_word_embeddings=True)


@pytest.fixture(scope="session")
def tiny_mistral_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """Mistral with a sliding window shorter than the longer test prompts."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("mistral"), "mistral", tiny_tokenizer,
                                seed=2, sliding_window=24)


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """Qwen3: per-head q/k RMSNorm (jittered weights), tied embeddings."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("qwen3"), "qwen3", tiny_tokenizer,
                                seed=3, head_dim=16, tie_word_embeddings=True,
                                norm_jitter=0.3)


GEMMA3_LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention",
                      "sliding_attention"]


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """Gemma 3: window 16 on 3 of 4 layers, two RoPE bases, (1 + w) norms (jittered),
    query_pre_attn_scalar != head_dim, 1 KV head (weights x2 only: its sqrt(hidden)
    embedding scale and post-norms make x8 models repeat one token)."""
    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("gemma3"), "gemma3", tiny_tokenizer, seed=4, head_dim=16,
        num_hidden_layers=4, num_key_value_heads=1, layer_types=GEMMA3_LAYER_TYPES,
        sliding_window=16, query_pre_attn_scalar=24, tie_word_embeddings=True,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        norm_jitter=0.3, weight_scale=2.0, pad_token_id=0)


@pytest.fixture(autouse=True)
def _quiet_logs(caplog):
    caplog.set_level(logging.WARNING)
    yield


@pytest.fixture(scope="session")
def make_llm():
    """`make_llm(model_dir, **engine_args)`: an LLM for the tiny checkpoints.

    Single-threaded (tiny matmuls only lose from threads, and on a busy 2-core machine two
    threads are ~100x slower) with a 16 MiB KV pool instead of the 2 GiB CPU default.
    """
    from pagedllm import LLM

    def make(model_dir: Path, **engine_args):
        engine_args.setdefault("num_threads", 1)
        engine_args.setdefault("kv_cache_memory", 16 * 2**20)
        return LLM(str(model_dir), **engine_args)

    return make


class HFReference:
    """Greedy decoding with HF transformers (its own KV cache, logits of the last position
    only), step by step so the log_softmax of every step is kept. Models and results are
    cached for the session."""

    def __init__(self) -> None:
        self._models: dict[str, torch.nn.Module] = {}
        self._results: dict[tuple, tuple[list[int], torch.Tensor]] = {}

    def register(self, model_dir: Path, model: torch.nn.Module) -> None:
        """Use an already loaded `model` for `model_dir`."""
        self._models[str(model_dir)] = model.eval()

    def model(self, model_dir: Path) -> torch.nn.Module:
        key = str(model_dir)
        if key not in self._models:
            import transformers

            self._models[key] = transformers.AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=torch.float32).eval()
        return self._models[key]

    @torch.inference_mode()
    def greedy(self, model_dir: Path, prompt: list[int], max_tokens: int
               ) -> tuple[list[int], torch.Tensor]:
        """(generated token ids, log_softmax of the logits at each step [max_tokens, V])."""
        key = (str(model_dir), tuple(prompt), max_tokens)
        cached = next((v for k, v in self._results.items()
                       if k[:2] == key[:2] and k[2] >= max_tokens), None)
        if cached is not None:
            return cached[0][:max_tokens], cached[1][:max_tokens]
        model = self.model(model_dir)
        # transformers renamed `past_key_values` to `cache` (5.2x); accept either.
        cache_kw = ("cache" if "cache" in inspect.signature(model.forward).parameters
                    else "past_key_values")
        inputs, cache = torch.tensor([prompt]), None
        generated, rows = [], []
        for _ in range(max_tokens):
            out = model(inputs, use_cache=True, logits_to_keep=1, **{cache_kw: cache})
            cache = getattr(out, cache_kw)
            logprobs = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            rows.append(logprobs)
            generated.append(int(logprobs.argmax()))
            inputs = torch.tensor([[generated[-1]]])
        self._results[key] = (generated, torch.stack(rows))
        return self._results[key]


@pytest.fixture(scope="session")
def hf_reference() -> HFReference:
    return HFReference()
