"""bf16 experts (model/layers/moe/grouped_bf16.py, kernels/grouped_bf16_cpu.cpp): one C++ call
per projection over fp32 rows sorted by expert, on every ISA path this CPU runs
(PAGEDLLM_BF16_ISA), equals the per-expert reference of the contract:

    a group below MIN_BF16_ROWS rows, or any group on a path without the bf16 dot product:
        x @ widened(W_e)^T, the fp32 linear's own FMA chains: bit for bit packed_linear
        (gemm_cpu.cpp) over W_e.float()
    a group of MIN_BF16_ROWS rows or more on avx512_bf16:
        bf16(x) @ widened(W_e)^T: the products are exact in fp32 (8-bit x 8-bit mantissas),
        only the order of the fp32 sums differs from torch's, so each output is within
        2 K 2^-24 sum_k |bf16(x)_k W_e[n, k]| of torch's (each sum's own rounding bound)

over the routing edge cases (all tokens to one expert, an expert with no tokens, top-k = E)
at 1, 7, 32 and 300 tokens, with odd sizes (K odd, N not whole panels). A tiny Mixtral and
Qwen3-MoE loaded in bfloat16 agree with HF transformers in fp32 by vLLM's logprob rule."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedllm.kernels import cpu_features, cpu_ops
from pagedllm.model.layers.moe import RouterSpec, StackedExperts, group_by_expert, select_experts
from pagedllm.model.layers.moe.grouped import offsets_of
from pagedllm.model.layers.moe.grouped_bf16 import (
    ISA_ENV,
    MIN_BF16_ROWS,
    Bf16Experts,
    UnknownISAError,
    isas,
)

H, INTER, E = 67, 45, 5  # odd: K = 67 and 45 end on half a pair; N = 90, 67: partial panels
ALL_ISAS = ["avx512_bf16", "avx512", "avx2", "generic"]
# the /proc/cpuinfo flags each path needs
ISA_FLAGS = {"avx512_bf16": {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"},
             "avx512": {"avx512f", "avx512bw"}, "avx2": {"avx2", "fma"}, "generic": set()}


def bf16_weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    gate_up = (torch.randn(E, 2 * INTER, H, generator=g) * H**-0.5).bfloat16()
    down = (torch.randn(E, H, INTER, generator=g) * INTER**-0.5).bfloat16()
    return gate_up, down


def bf16_experts(gate_up: torch.Tensor, down: torch.Tensor) -> StackedExperts:
    experts = StackedExperts(E, H, INTER).to(torch.bfloat16)
    with torch.no_grad():
        experts.gate_up_proj.copy_(gate_up)
        experts.down_proj.copy_(down)
    experts.finalize()
    assert experts.bf16, "the grouped bf16 kernel must be built here"
    return experts


def routing(tokens: int, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """name -> (x [tokens, H], weights, ids) for the routing edge cases."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, H, generator=g)
    no_tokens = torch.tensor([0, 3, 4])[torch.arange(tokens) % 3]  # experts 1 and 2: none
    return {
        "top-2": (x, *select_experts(torch.randn(tokens, E, generator=g),
                                     RouterSpec(E, 2, renormalize=True))),
        "all to one expert": (x, torch.rand(tokens, 1, generator=g),
                              torch.full((tokens, 1), 3)),
        "experts with no tokens": (x, torch.rand(tokens, 2, generator=g),
                                   torch.stack([no_tokens, (no_tokens + 1) % E], dim=1)),
        "top-k = experts": (x, *select_experts(torch.randn(tokens, E, generator=g),
                                               RouterSpec(E, E, renormalize=False))),
    }


CASES = {f"{name} x{t}": case for t in (1, 7, 32, 300)
         for name, case in routing(t, seed=t).items()}


def rounds(isa: str, rows: int) -> bool:
    """Whether a group of `rows` rows takes the bf16 dot product (x rounded) on `isa`."""
    return isa == "avx512_bf16" and rows >= MIN_BF16_ROWS


@pytest.fixture(params=ALL_ISAS)
def isa(request, monkeypatch) -> str:
    """Each ISA path, forced through PAGEDLLM_BF16_ISA; skipped where this CPU lacks it."""
    name = request.param
    if name not in isas():
        lacking = ISA_FLAGS[name] - set(cpu_features.cpu_flags())
        pytest.skip(f"this CPU lacks {' '.join(sorted(lacking)) or name} for the {name} path")
    monkeypatch.setenv(ISA_ENV, name)
    return name


@pytest.fixture(scope="module")
def weights():
    return bf16_weights()


@pytest.fixture(scope="module")
def experts(weights):
    return bf16_experts(*weights)


def assert_group_matches(got, x, w, isa, min_bf16_rows: int = MIN_BF16_ROWS) -> None:
    """One expert's rows against the contract (module doc)."""
    ops = cpu_ops.load()
    n = w.shape[0]
    if not (isa == "avx512_bf16" and x.shape[0] >= min_bf16_rows):
        want = ops.packed_linear(x.contiguous(), ops.pack_linear_weight(w.float()), n, None)
        assert torch.equal(got, want), f"max diff {(got - want).abs().max():.3g}"
        return
    xb, wf = x.bfloat16().float(), w.float()
    bound = 2 * x.shape[1] * 2.0**-24 * (xb.abs() @ wf.abs().t())
    err = (got - xb @ wf.t()).abs()
    assert (err <= bound).all(), f"error {err.max():.3g} over the bound {bound.max():.3g}"


@pytest.mark.parametrize("case", list(CASES))
def test_each_projection_equals_the_per_expert_reference(experts, weights, isa, case) -> None:
    x, _, ids = CASES[case]
    order, counts = group_by_expert(ids, E)
    xs = x[order // ids.shape[1]]
    offsets = offsets_of(counts)
    h = experts.packed[0].run(xs, offsets)
    act = F.silu(h[:, :INTER]) * h[:, INTER:]
    out = experts.packed[1].run(act, offsets)
    start = 0
    for e, n in enumerate(counts):
        rows = slice(start, start + n)
        assert_group_matches(h[rows], xs[rows], weights[0][e], isa)
        assert_group_matches(out[rows], act[rows], weights[1][e], isa)
        start += n


@pytest.mark.parametrize("min_bf16_rows", [1, 2**30], ids=["dot-from-1-row", "exact-only"])
def test_every_group_size_on_either_path(isa, min_bf16_rows) -> None:
    """Groups of 1 ... 13 rows (a few rows: two panels per pass on AVX-512; 4 panels, then
    3: an even and an odd panel count) forced onto one path, then the other."""
    g = torch.Generator().manual_seed(5)
    counts = [1, 2, 3, 4, 0, 5, 8, 13]
    for n_out in (100, 90):
        w = (torch.randn(len(counts), n_out, H, generator=g) * H**-0.5).bfloat16()
        grouped = Bf16Experts(cpu_ops.load(), w, min_bf16_rows=min_bf16_rows)
        xs = torch.randn(sum(counts), H, generator=g)
        got = grouped.run(xs, offsets_of(counts))
        start = 0
        for e, n in enumerate(counts):
            rows = slice(start, start + n)
            assert_group_matches(got[rows], xs[rows], w[e], isa, min_bf16_rows)
            start += n


def rule_reference(weights, x, router_weights, ids, isa) -> torch.Tensor:
    """The layer's sum by the contract, one token and one expert at a time in torch: x
    rounded to bf16 where the expert's group takes the bf16 dot product."""
    gate_up, down = (w.float() for w in weights)
    counts = torch.bincount(ids.reshape(-1), minlength=E).tolist()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(router_weights[t].tolist(), ids[t].tolist(), strict=True):
            xt = x[t].bfloat16().float() if rounds(isa, counts[e]) else x[t]
            gate, up = (gate_up[e] @ xt).chunk(2)
            h = F.silu(gate) * up
            h = h.bfloat16().float() if rounds(isa, counts[e]) else h
            out[t] += w * (down[e] @ h)
    return out


@pytest.mark.parametrize("case", [c for c in CASES if not c.endswith("x300")])
def test_the_layer_equals_the_rule_reference(experts, weights, isa, case) -> None:
    """Through StackedExperts.forward (the host grouping path at <= 16 assignments)."""
    x, router_weights, ids = CASES[case]
    got = experts(x, router_weights, ids)
    torch.testing.assert_close(got, rule_reference(weights, x, router_weights, ids, isa),
                               rtol=1e-4, atol=1e-5)


def test_the_layer_at_300_tokens_equals_the_per_expert_loop(experts) -> None:
    """The general path (sort, one call per projection) at 300 tokens: the per-expert torch
    loop on the widened weights, within bf16 rounding of the large groups' activations."""
    x, router_weights, ids = CASES["top-2 x300"]
    k = ids.shape[1]
    order, counts = group_by_expert(ids, E)
    assert min(counts) >= MIN_BF16_ROWS  # every group large: the rounded path where it exists
    ref = experts.reference(x[order // k], counts)
    ref.mul_(router_weights.reshape(-1)[order].unsqueeze(1))
    ref = torch.zeros_like(x).index_add_(0, order // k, ref)
    torch.testing.assert_close(experts(x, router_weights, ids), ref, rtol=0.02, atol=0.02)


def test_bf16_activations_run_as_fp32_rows(experts) -> None:
    """An all-bf16 model hands bf16 rows: widened at the entry, the result rounded back."""
    x, router_weights, ids = CASES["top-2 x7"]
    xb = x.bfloat16()
    got = experts(xb, router_weights.bfloat16(), ids)
    assert got.dtype == torch.bfloat16
    want = experts(xb.float(), router_weights.bfloat16().float(), ids).bfloat16()
    assert torch.equal(got, want)


def test_packing_holds_the_bf16_weights_once(experts, weights) -> None:
    gate_up, down = weights
    assert experts.gate_up_proj.numel() == 0 and experts.down_proj.numel() == 0
    assert experts.packed[0].packed.dtype == torch.bfloat16
    for e in range(E):
        assert torch.equal(experts.packed[0].dense(e), gate_up[e])
        assert torch.equal(experts.packed[1].dense(e), down[e])
    # padding only: N to whole panels of 32, K to whole pairs
    padded = E * 2 * (96 * 68 + 96 * 46)
    assert experts.weight_nbytes == padded
    aligned = Bf16Experts(cpu_ops.load(), torch.zeros(3, 64, 48, dtype=torch.bfloat16))
    assert aligned.nbytes == 3 * 64 * 48 * 2


def test_this_cpus_best_path_is_the_default() -> None:
    flags = set(cpu_features.cpu_flags())
    want = [name for name in ALL_ISAS if ISA_FLAGS[name] <= flags]
    assert list(isas()) == want
    assert rounds(isas()[0], MIN_BF16_ROWS) == ("avx512_bf16" in flags)


def test_an_isa_this_cpu_cannot_run_is_a_clear_error(experts, monkeypatch) -> None:
    monkeypatch.setenv(ISA_ENV, "amx_bf16")
    x, router_weights, ids = CASES["top-2 x7"]
    with pytest.raises(UnknownISAError, match="PAGEDLLM_BF16_ISA='amx_bf16'"):
        experts(x, router_weights, ids)


def test_min_bf16_rows_is_validated() -> None:
    with pytest.raises(ValueError, match="min_bf16_rows"):
        Bf16Experts(cpu_ops.load(), torch.zeros(1, 32, 2, dtype=torch.bfloat16), min_bf16_rows=0)



def test_fp32_loaded_experts_finalize_in_bf16(weights) -> None:
    """`finalize(weight_dtype=bfloat16)` on experts loaded in fp32 (the regime of bf16 weights
    with fp32 activations): held as the bf16 weights, as if loaded in bf16."""
    gate_up, down = weights
    experts = StackedExperts(E, H, INTER)
    with torch.no_grad():
        experts.gate_up_proj.copy_(gate_up.float())
        experts.down_proj.copy_(down.float())
    experts.finalize(weight_dtype=torch.bfloat16)
    assert experts.bf16 and torch.equal(experts.packed[1].dense(2), down[2])
    with pytest.raises(ValueError, match="float dtype"):
        StackedExperts(E, H, INTER).finalize(weight_dtype=torch.int8)


ENGINE_FAMILIES = ["mixtral", "qwen3_moe"]
ENGINE_TOKENS = 20


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory, tiny_tokenizer):
    from tests.model.family_checkpoints import make_family_checkpoint

    return {family: make_family_checkpoint(tmp_path_factory.mktemp(family), family,
                                           tiny_tokenizer, seed=30 + i)
            for i, family in enumerate(ENGINE_FAMILIES)}


def greedy(llm):
    from pagedllm import SamplingParams
    from tests.model.test_vs_hf import PROMPTS

    params = SamplingParams(temperature=0.0, max_tokens=ENGINE_TOKENS, ignore_eos=True,
                            logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


def held_experts(llm) -> list[StackedExperts]:
    return [m for m in llm.llm_engine.model.modules() if isinstance(m, StackedExperts)]


@pytest.mark.parametrize("family", ENGINE_FAMILIES)
def test_bf16_experts_with_fp32_activations_agree_with_hf_fp32(family, moe_dirs, make_llm,
                                                               hf_reference) -> None:
    """`--dtype bfloat16` on CPU (bf16 weights, fp32 activations): the experts are held in
    bf16 like the linear layers (StackedExperts reads the weight dtype at construction):
    8 prompts of 1 ... 75 tokens prefilled together (groups of both paths), 20 greedy tokens
    each, equal to HF's in fp32 up to the first difference, where each side's token is among
    the other's top 5 (vLLM's check_logprobs_close)."""
    from types import SimpleNamespace

    from tests.model.quant.test_int8_engine import check_logprobs_close
    from tests.model.test_vs_hf import PROMPTS

    llm = make_llm(moe_dirs[family], dtype="bfloat16")
    assert llm.llm_engine.config.torch_dtype == torch.float32
    assert all(m.bf16 for m in held_experts(llm)) and held_experts(llm)
    same = []
    for prompt, out in zip(PROMPTS, greedy(llm), strict=True):
        tokens, logprobs = hf_reference.greedy(moe_dirs[family], prompt, ENGINE_TOKENS)
        hf = SimpleNamespace(token_ids=tokens,
                             logprobs=[set(row.topk(5).indices.tolist()) for row in logprobs])
        same.append(check_logprobs_close(out, hf))
    assert sum(same) >= len(PROMPTS) * ENGINE_TOKENS // 2, same


@pytest.mark.parametrize("family", ENGINE_FAMILIES)
def test_the_grouped_bf16_kernel_agrees_with_the_per_expert_loop(family, moe_dirs, make_llm,
                                                                 monkeypatch) -> None:
    """`--dtype bfloat16`: the experts take the grouped bf16 kernel and agree by vLLM's rule
    with the same model whose bf16 experts run the per-expert torch loop."""
    from pagedllm.model.layers.moe import experts as experts_module
    from tests.model.quant.test_int8_engine import check_logprobs_close

    grouped = make_llm(moe_dirs[family], dtype="bfloat16")
    assert all(m.bf16 for m in held_experts(grouped)) and held_experts(grouped)
    monkeypatch.setattr(experts_module, "bf16_experts", lambda weights: None)
    loop = make_llm(moe_dirs[family], dtype="bfloat16")
    assert not any(m.bf16 for m in held_experts(loop))
    assert all(m.gate_up_proj.dtype == torch.bfloat16 for m in held_experts(loop))
    same = [check_logprobs_close(a, b) for a, b in zip(greedy(grouped), greedy(loop),
                                                          strict=True)]
    assert min(same) >= 1, same


def test_bf16_moe_weights_are_counted_as_planned(moe_dirs, make_llm) -> None:
    """The start-up count of resident weight bytes (packed bf16 experts included) is what
    `pagedllm plan` says for --dtype bfloat16."""
    from pagedllm.config import EngineConfig
    from pagedllm.memory_plan import load_config, plan_for_engine
    from pagedllm.worker.model_setup import weight_bytes

    source = moe_dirs["mixtral"]
    llm = make_llm(source, dtype="bfloat16")
    plan = plan_for_engine(load_config(str(source)),
                           EngineConfig(model=str(source), dtype="bfloat16",
                                        kv_cache_memory=16 * 2**20))
    assert sum(m.weight_nbytes for m in held_experts(llm)) == plan.expert_bytes
    assert weight_bytes(llm.llm_engine.model) == plan.weight_bytes
