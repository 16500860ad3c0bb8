"""MoE experts quantized to int8 at load (`--quantization int8`) stay int8 (one kernel call
per expert group): greedy tokens equal HF transformers on the dequantized int8 weights and
logprobs are within 1e-4, as for dense layers (tests/model/quant/test_int8_engine.py)."""

from __future__ import annotations

import shutil

import pytest
from safetensors.torch import load_file, save_file

from pagedllm import SamplingParams
from pagedllm.model.layers.moe import StackedExperts
from pagedllm.model.layers.quant.hf_checkpoint import is_linear_weight
from pagedllm.model.layers.quant.int8 import Int8Weight
from pagedllm.worker.model_setup import weight_bytes
from tests.model.family_checkpoints import make_family_checkpoint
from tests.model.test_vs_hf import PROMPTS

MAX_TOKENS = 24


@pytest.fixture(scope="module", params=["mixtral", "qwen2_moe"])
def int8_pair(request, tmp_path_factory, tiny_tokenizer):
    """(the tiny MoE, the same with every linear weight replaced by its int8 dequantization)."""
    src = make_family_checkpoint(
        tmp_path_factory.mktemp(request.param), request.param, tiny_tokenizer, seed=30
    )
    ref = tmp_path_factory.mktemp(f"{request.param}_int8_ref")
    for f in src.iterdir():
        shutil.copy(f, ref / f.name)
    tensors = load_file(str(src / "model.safetensors"))
    save_file(
        {
            n: Int8Weight.quantize(t).dequantize() if is_linear_weight(n, t) else t
            for n, t in tensors.items()
        },
        str(ref / "model.safetensors"),
    )
    return src, ref


def test_int8_experts_match_hf_on_dequantized_weights(int8_pair, make_llm, hf_reference) -> None:
    src, ref = int8_pair
    llm = make_llm(src, quantization="int8", int8_activations=False)
    model = llm.llm_engine.model
    experts = [m for m in model.modules() if isinstance(m, StackedExperts)]
    assert experts and all(m.quant is not None and m.quant.format == "int8" for m in experts)
    assert all(m.gate_up_proj.numel() == 0 for m in experts)  # the float copy is freed
    dense = make_llm(src).llm_engine.model
    dense_experts = [m for m in dense.modules() if isinstance(m, StackedExperts)]
    # int8 rows plus one fp32 scale per row, against fp32: under a third of the bytes.
    assert experts[0].weight_nbytes * 3 < dense_experts[0].weight_nbytes
    assert experts[0].weight_nbytes == experts[0].quant.nbytes
    assert weight_bytes(model) < weight_bytes(dense)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        expected, ref_logprobs = hf_reference.greedy(ref, prompt, MAX_TOKENS)
        assert out.outputs[0].token_ids == expected, f"prompt of {len(prompt)} tokens"
        for step, entry in enumerate(out.outputs[0].logprobs):
            for tid, lp in entry.items():
                assert lp.logprob == pytest.approx(ref_logprobs[step][tid].item(), abs=1e-4)
