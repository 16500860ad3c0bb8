"""Mixture-of-experts layers in the C++ decode loop (model/fused_decode.py,
kernels/moe_decode_cpu.h) compute what the Python layers compute, to the bit: greedy tokens
and logprobs equal with the loop on and off for Mixtral, Qwen2-MoE (shared expert, a dense
layer) and Qwen3-MoE (per-head q/k norms), fp32 and GGUF experts (blocks with fp32 or int8
activations), at batches on both sides of the experts' small-batch path; greedy Mixtral equals
HF transformers with the loop on. OLMoE's attention (q/k norms over all heads, clipping) keeps
the Python layers. The C++ block equals the torch ops of `FusedMoE.forward_torch`, which the
Python layers no longer call on CPU, for each family's routing (renormalized or not) and the
routing edge cases (ties, top-k = number of experts, every token to one expert)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedllm.kernels import cpu_ops
from pagedllm.loader.cache import CACHE_DIR_ENV
from pagedllm.model.fused_decode import FusedDecode
from pagedllm.model.layers.moe import FusedMoE, RouterSpec
from pagedllm.model.layers.moe import experts as experts_mod
from tests.model.family_checkpoints import make_family_checkpoint
from tests.model.test_fused_decode import assert_same, decoder, outputs
from tests.model.test_vs_hf import PROMPTS, assert_matches_hf


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory, tiny_tokenizer) -> dict[str, Path]:
    return {family: make_family_checkpoint(tmp_path_factory.mktemp(family), family,
                                           tiny_tokenizer, seed=50 + i)
            for i, family in enumerate(("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"))}


def blocks(llm) -> list[FusedMoE]:
    return [m for m in llm.llm_engine.model.modules() if isinstance(m, FusedMoE)]


def check_loop_equals_torch_layers(llm, prompts: list[list[int]], monkeypatch) -> None:
    """Outputs with the loop equal those of the Python layers with the MoE blocks in torch
    ops (`forward_torch`, not the C++ block both would otherwise share)."""
    fused = outputs(llm, prompts)
    assert isinstance(decoder(llm).fused_decode(), FusedDecode)  # it ran
    decoder(llm)._fused = None  # the Python layer loop from now on
    monkeypatch.setattr(FusedMoE, "forward", FusedMoE.forward_torch)
    assert_same(fused, outputs(llm, prompts))


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe"])
@pytest.mark.parametrize("max_num_seqs", [4, 12])
def test_fused_equals_layers(moe_dirs, make_llm, monkeypatch, family: str,
                             max_num_seqs: int) -> None:
    """12 sequences of top-2: 24 assignments, past the small-batch path (experts.py)."""
    assert 4 * 2 <= experts_mod.SMALL_BATCH < 12 * 2
    llm = make_llm(moe_dirs[family], max_num_seqs=max_num_seqs, enable_prefix_caching=False)
    if family == "qwen2_moe":
        assert any(b.shared_expert_gate is not None for b in blocks(llm))
    check_loop_equals_torch_layers(llm, [*PROMPTS, *PROMPTS][:max_num_seqs], monkeypatch)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_bf16_experts_in_the_loop(moe_dirs, make_llm, monkeypatch, family: str) -> None:
    """`--dtype bfloat16` on CPU: bf16 linear layers and bf16 experts (the grouped bf16
    kernel, groups on both sides of its bf16 dot product threshold at 12 sequences) run in
    the loop, equal to the Python layers."""
    llm = make_llm(moe_dirs[family], dtype="bfloat16", max_num_seqs=12,
                   enable_prefix_caching=False)
    assert blocks(llm) and all(b.experts.bf16 for b in blocks(llm))
    check_loop_equals_torch_layers(llm, [*PROMPTS, *PROMPTS][:12], monkeypatch)


def test_mixtral_with_the_loop_matches_hf(moe_dirs, make_llm, hf_reference) -> None:
    llm = make_llm(moe_dirs["mixtral"])
    assert isinstance(decoder(llm).fused_decode(), FusedDecode)
    assert_matches_hf(llm, moe_dirs["mixtral"], hf_reference, PROMPTS)


@pytest.mark.parametrize("family", ["qwen3_moe", "olmoe"])
def test_blocks_equal_the_torch_path(moe_dirs, make_llm, family: str) -> None:
    """Each MoE block's C++ form equals its torch ops: renormalized (Qwen3-MoE) or not
    (OLMoE, whose q/k norms over all heads keep the Python layers: its blocks still call
    the C++ block, FusedMoE.forward)."""
    llm = make_llm(moe_dirs[family])
    assert (decoder(llm).fused_decode() is None) == (family == "olmoe")
    ops = cpu_ops.load()
    renormalized = {b.router.renormalize for b in blocks(llm)}
    assert renormalized == {family == "qwen3_moe"}
    g = torch.Generator().manual_seed(3)
    for block in blocks(llm):
        ref = block.fused_ref(ops)
        for tokens in (1, 3, 20):
            x = torch.randn(tokens, block.gate.in_features, generator=g)
            assert torch.equal(ref(x), block.forward_torch(x))


@pytest.mark.parametrize("int8_activations", [False, True], ids=["gguf", "gguf-a8"])
def test_gguf_experts_in_the_loop(tmp_path, tiny_tokenizer, make_llm, monkeypatch,
                                  int8_activations: bool) -> None:
    import gguf

    from tests.loader.gguf_writer import write_gguf

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    src = make_family_checkpoint(tmp_path / "hf", "mixtral", tiny_tokenizer, seed=41,
                                 intermediate_size=64)
    path = write_gguf(src, tmp_path / "mixtral-q8_0.gguf", "llama",
                      gguf.GGMLQuantizationType.Q8_0)
    llm = make_llm(path, int8_activations=int8_activations, max_model_len=512,
                   enable_prefix_caching=False, max_num_seqs=12)
    assert all(b.experts.quant is not None for b in blocks(llm))
    check_loop_equals_torch_layers(llm, [*PROMPTS, *PROMPTS][:12], monkeypatch)


def routed_block(num_experts: int, top_k: int, renormalize: bool, seed: int,
                 router: torch.Tensor | None = None,
                 expert_dtype: torch.dtype | None = None) -> FusedMoE:
    """A random block (`router`: the router's weight [E, 32], else random), finalized as
    loading does (router packed, experts stacked for the grouped kernel of `expert_dtype`)."""
    block = FusedMoE(32, 48, RouterSpec(num_experts, top_k, renormalize=renormalize))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        if router is not None:
            block.gate.weight.copy_(router)
    block.gate.finalize()
    block.experts.finalize(weight_dtype=expert_dtype)
    return block


@pytest.mark.parametrize("expert_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", ["ties", "top-k = experts", "all to one expert"])
@pytest.mark.parametrize("tokens", [1, 5, 20])
def test_routing_edge_cases(case: str, tokens: int, expert_dtype: torch.dtype) -> None:
    """x > 0, so a router row of ones outscores rows of zeros for every token. bf16 experts:
    groups below and (20 tokens to one expert) above the bf16 dot product's threshold."""
    experts = 16 if case == "top-k = experts" else 6  # one token: 16 rows summed
    router = torch.zeros(experts, 32)
    if case == "ties":  # experts 1, 3 and 4 score the same for every token
        router[[1, 3, 4]] = 1.0
    elif case == "all to one expert":
        router[4] = 1.0
    else:
        router = None
    top_k = {"ties": 2, "top-k = experts": experts, "all to one expert": 1}[case]
    block = routed_block(experts, top_k, case != "ties", seed=7, router=router,
                         expert_dtype=expert_dtype)
    assert block.experts.bf16 == (expert_dtype == torch.bfloat16)
    x = torch.rand(tokens, 32, generator=torch.Generator().manual_seed(8)) + 0.1
    ref = block.fused_ref(cpu_ops.load())
    assert ref is not None
    expected = block.forward_torch(x)
    assert torch.equal(ref(x), expected)
    assert torch.equal(block(x), expected)  # the block's own CPU path is the C++ one


def test_a_forced_bf16_isa_keeps_the_python_block(monkeypatch) -> None:
    """PAGEDLLM_BF16_ISA (a path forced for tests / comparison) is honoured by the Python
    block; the C++ block runs this CPU's own choice, so it steps aside."""
    from pagedllm.model.layers.moe.grouped_bf16 import ISA_ENV

    ops = cpu_ops.load()
    block = routed_block(4, 2, True, 1, expert_dtype=torch.bfloat16)
    assert block.fused_ref(ops) is not None
    monkeypatch.setenv(ISA_ENV, "generic")
    assert block.fused_ref(ops) is None


def test_routings_the_loop_does_not_run() -> None:
    """DeepSeek's routing (expert bias, groups, scaling) keeps the Python block."""
    ops = cpu_ops.load()
    assert routed_block(4, 2, True, 1).fused_ref(ops) is not None
    grouped = FusedMoE(32, 48, RouterSpec(4, 2, num_groups=2, topk_groups=1))
    biased = FusedMoE(32, 48, RouterSpec(4, 2, scoring="sigmoid"), with_expert_bias=True)
    for block in (grouped, biased):
        block.gate.finalize()
        block.experts.finalize()
        assert block.fused_ref(ops) is None
