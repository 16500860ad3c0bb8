"""AWQ and GPTQ checkpoints: the tests quantize a tiny random Llama themselves (hf_packers.py,
written from the published formats), save it with a `quantization_config`, load it through the
engine, and compare greedy tokens (exact) and logprobs (1e-4) with HF transformers on the
dequantized weights; plus unpacking, fusion and the loader's errors."""

from __future__ import annotations

import json

import pytest
import torch

from pagedllm import SamplingParams
from pagedllm.model.layers.quant.awq import AwqWeight
from pagedllm.model.layers.quant.gptq import GptqWeight
from pagedllm.model.layers.quant.hf_checkpoint import HFQuantConfig
from pagedllm.model.layers.quant.int4 import Int4GroupWeight
from tests.model.quant import hf_packers

PROMPTS = [[5, 9, 200, 17], list(range(30, 63)), [400, 3, 3, 77, 12, 9, 101]]
MAX_TOKENS = 24
TOP = 5

CASES = {  # name: (method, group_size, sym, desc_act)
    "awq-g32": ("awq", 32, False, False),
    "awq-g64": ("awq", 64, False, False),
    "gptq-sym-g32": ("gptq", 32, True, False),
    "gptq-asym-g64": ("gptq", 64, False, False),
    "gptq-act-order-g32": ("gptq", 32, False, True),
}


@pytest.fixture(scope="module", params=list(CASES))
def quantized_pair(request, tmp_path_factory, tiny_llama_dir):
    method, gs, sym, desc_act = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    hf_packers.write_quantized(tiny_llama_dir, root / "q", root / "ref", method, gs, sym=sym,
                               desc_act=desc_act)
    return request.param, root / "q", root / "ref"


def test_engine_matches_hf_on_the_dequantized_weights(quantized_pair, make_llm, hf_reference):
    name, qdir, refdir = quantized_pair
    llm = make_llm(qdir)
    layer = llm.llm_engine.model.model.layers[0]
    method = CASES[name][0]
    for lin in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert lin.quant is not None and lin.quant.format == method and lin.weight.numel() == 0
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                            logprobs=TOP)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        expected, ref = hf_reference.greedy(refdir, prompt, MAX_TOKENS)
        got = out.outputs[0]
        assert got.token_ids == expected, f"{name}: prompt of {len(prompt)} tokens"
        for step, entry in enumerate(got.logprobs):
            values, ids = ref[step].topk(TOP)
            for tid, value in zip(ids.tolist(), values.tolist(), strict=True):
                assert entry[tid].logprob == pytest.approx(value, abs=1e-4), f"{name} {step}"


def test_fused_decode_loop_equals_layers(quantized_pair, make_llm):
    """The int4 kernel runs in the C++ decode loop (by address, kernels/extern_linear_cpu.h)
    and gives the Python layers' results to the bit; GPTQ's act-order permutes x first, which
    the loop does not do, so those models keep the Python layers."""
    from tests.model.test_fused_decode import check_fused_equals_layers, decoder, outputs

    name, qdir, _ = quantized_pair
    llm = make_llm(qdir, enable_prefix_caching=False)
    if CASES[name][3]:
        outputs(llm)
        assert decoder(llm).fused_decode() is None
        return
    check_fused_equals_layers(llm)


def test_none_dequantizes_and_mismatched_choice_is_refused(quantized_pair, make_llm):
    name, qdir, _ = quantized_pair
    dense = make_llm(qdir, quantization="none")
    assert dense.llm_engine.model.model.layers[0].mlp.down_proj.method.format.startswith("dense")
    other = "gptq" if CASES[name][0] == "awq" else "awq"
    with pytest.raises(ValueError, match="does not match"):
        make_llm(qdir, quantization=other)
    with pytest.raises(ValueError, match="already"):
        make_llm(qdir, quantization="int8")


@pytest.mark.parametrize("gs", [32, 64, 128])
def test_awq_unpacks_the_published_packing(gs):
    torch.manual_seed(gs)
    w = torch.randn(48, 256)
    q, z, s, g_idx = hf_packers.quantize_groups(w, gs, sym=False)
    packed = hf_packers.pack_awq(q, z, s)
    weight = AwqWeight.from_checkpoint(packed["qweight"], packed["qzeros"], packed["scales"], gs)
    assert weight.shape == (48, 256)
    assert torch.equal(weight.dequantize(), hf_packers.dequantize(q, z, s, g_idx))
    # 4 bits per weight + a uint8 zero and a float16 scale per group and column (+ padding)
    assert weight.nbytes <= (48 + 31) // 32 * 32 * (256 // 2 + 3 * 256 // gs)


@pytest.mark.parametrize(("sym", "desc_act"), [(True, False), (False, False), (False, True)])
def test_gptq_unpacks_the_published_packing(sym, desc_act):
    torch.manual_seed(1)
    w = torch.randn(40, 128)
    g_idx = None
    if desc_act:
        g_idx = torch.empty(128, dtype=torch.long)
        g_idx[torch.randperm(128)] = torch.arange(128) // 32
    q, z, s, g_idx = hf_packers.quantize_groups(w, 32, sym=sym, g_idx=g_idx)
    p = hf_packers.pack_gptq(q, z, s, g_idx)
    weight = GptqWeight.from_checkpoint(p["qweight"], p["qzeros"], p["scales"], p["g_idx"], 32)
    ref = hf_packers.dequantize(q, z, s, g_idx)
    assert torch.equal(weight.dequantize(), ref)
    assert (weight.perm is not None) == desc_act
    x = torch.randn(3, 128)
    torch.testing.assert_close(weight.linear(x), x @ ref.t(), rtol=1e-5, atol=1e-4)


def test_fused_parts_concat_unless_act_orders_differ():
    torch.manual_seed(2)
    parts = []
    for seed in range(2):
        g = torch.empty(64, dtype=torch.long)
        g[torch.randperm(64, generator=torch.Generator().manual_seed(seed))] = \
            torch.arange(64) // 32
        q, z, s, g = hf_packers.quantize_groups(torch.randn(16, 64), 32, sym=False, g_idx=g)
        p = hf_packers.pack_gptq(q, z, s, g)
        parts.append(GptqWeight.from_checkpoint(p["qweight"], p["qzeros"], p["scales"],
                                                p["g_idx"], 32))
    with pytest.raises(NotImplementedError, match="permutation"):
        GptqWeight.concat(parts)
    same = GptqWeight.concat([parts[0], parts[0]])
    assert isinstance(same, Int4GroupWeight) and same.shape == (32, 64)
    torch.testing.assert_close(same.dequantize(), torch.cat([parts[0].dequantize()] * 2))


def test_unsupported_quantization_configs_are_clear_errors(tmp_path, tiny_llama_dir, make_llm):
    with pytest.raises(ValueError, match="bits"):
        HFQuantConfig.from_dict({"quant_method": "gptq", "bits": 8})
    with pytest.raises(ValueError, match="gemv"):
        HFQuantConfig.from_dict({"quant_method": "awq", "version": "gemv"})
    hf_packers.write_quantized(tiny_llama_dir, tmp_path / "q", tmp_path / "ref", "awq", 32)
    cfg = json.loads((tmp_path / "q" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (tmp_path / "q" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported quantization method 'bitsandbytes'"):
        make_llm(tmp_path / "q")
