"""`--quantization int8` through the engine: weight-only int8 equals HF transformers on the
dequantized int8 weights (greedy tokens exact, logprobs 1e-4); W8A8 (`int8_activations`) is
close by vLLM's rule (at the first differing greedy position each side's token is in the
other's top-5 logprobs)."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

from pagedllm import SamplingParams
from pagedllm.model.layers.quant.hf_checkpoint import is_linear_weight
from pagedllm.model.layers.quant.int8 import Int8Weight

PROMPTS = [[5, 9, 200, 17], list(range(30, 63)), [400, 3, 3, 77, 12, 9, 101], [7] * 20]
MAX_TOKENS = 24
TOP = 5


@pytest.fixture(scope="module")
def int8_reference_dir(tmp_path_factory, tiny_llama_dir):
    """The tiny Llama with its linear weights replaced by their int8 dequantization."""
    dst = tmp_path_factory.mktemp("int8_ref")
    for f in tiny_llama_dir.iterdir():
        shutil.copy(f, dst / f.name)
    tensors = load_file(str(tiny_llama_dir / "model.safetensors"))
    save_file({n: Int8Weight.quantize(t).dequantize() if is_linear_weight(n, t) else t
               for n, t in tensors.items()}, str(dst / "model.safetensors"))
    return dst


def generate(llm):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                            logprobs=TOP)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


def test_int8_weight_only_matches_hf_on_dequantized_weights(tiny_llama_dir, int8_reference_dir,
                                                             make_llm, hf_reference):
    llm = make_llm(tiny_llama_dir, quantization="int8", int8_activations=False)
    model = llm.llm_engine.model
    qkv = model.model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv.quant, Int8Weight) and not qkv.quant.w8a8
    assert model.lm_head.method.format.startswith("dense")  # lm_head, embeddings stay float
    for prompt, got in zip(PROMPTS, generate(llm), strict=True):
        expected, ref = hf_reference.greedy(int8_reference_dir, prompt, MAX_TOKENS)
        assert got.token_ids == expected
        for step, entry in enumerate(got.logprobs):
            values, ids = ref[step].topk(TOP)
            for tid, value in zip(ids.tolist(), values.tolist(), strict=True):
                assert entry[tid].logprob == pytest.approx(value, abs=1e-4), step


def check_logprobs_close(a, b) -> int:
    """vLLM's rule for two greedy outputs with top-N logprobs: identical up to the first
    differing position, where each side's token is among the other's top N. Returns the
    number of identical leading tokens."""
    for pos, (ta, tb) in enumerate(zip(a.token_ids, b.token_ids, strict=True)):
        if ta != tb:
            assert ta in b.logprobs[pos] and tb in a.logprobs[pos], f"position {pos}"
            return pos
    return len(a.token_ids)


def test_w8a8_is_close_by_vllms_rule(tiny_llama_dir, make_llm):
    w8a8 = make_llm(tiny_llama_dir, quantization="int8", int8_activations=True)
    assert w8a8.llm_engine.model.model.layers[0].mlp.down_proj.quant.w8a8
    weight_only = make_llm(tiny_llama_dir, quantization="int8", int8_activations=False)
    same = [check_logprobs_close(a, b)
            for a, b in zip(generate(w8a8), generate(weight_only), strict=True)]
    assert min(same) >= 1  # (the tiny random model's x8 weights make near-ties common)


@pytest.mark.slow
def test_smollm2_int8_and_w8a8_are_close_to_fp32_by_vllms_rule():
    """SmolLM2 (the default model): int8 weight-only and W8A8 greedy outputs vs the exact
    path, 4 prompts x 32 tokens, by vLLM's rule. (W8A8 with one activation scale per token
    failed it on one of these prompts; a scale per 32 values passes.)"""
    from pagedllm import LLM

    prompts = ["The capital of France is", "def fibonacci(n):",
               "Water boils at a temperature of", "Once upon a time, in a small village,"]
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=TOP)
    outs = {}
    variants = {"fp32": {"int8_activations": False},
                "int8": {"quantization": "int8", "int8_activations": False},
                "w8a8": {"quantization": "int8", "int8_activations": True}}
    for name, extra in variants.items():
        llm = LLM(None, num_threads=2, kv_cache_memory=64 * 2**20, max_model_len=256, **extra)
        outs[name] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        del llm
    # and identical leading tokens: int8 at least half; W8A8, whose activation rounding
    # moves near-ties sooner, at least 3/8 (63 of 128 when written, GGUF's a8 path 61)
    for name, least in (("int8", 64), ("w8a8", 48)):
        same = [check_logprobs_close(a, b)
                for a, b in zip(outs[name], outs["fp32"], strict=True)]
        assert sum(same) >= least, (name, same)


def test_int8_activations_need_int8_or_gguf(tiny_llama_dir, make_llm):
    from pagedllm.config import EngineConfig

    with pytest.raises(ValueError, match="int8_activations"):
        EngineConfig(int8_activations=True, quantization="none")
    with pytest.raises(ValueError, match="--int8-activations needs"):  # a float HF checkpoint
        make_llm(tiny_llama_dir, int8_activations=True)
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig(quantization="fp4")
