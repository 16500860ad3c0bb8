"""The grouped expert kernels (model/layers/moe/grouped.py, kernels/grouped_cpu.h): one C++
call per projection over rows sorted by expert equals the per-expert reference loop
(`StackedExperts.reference`), over the routing edge cases: all tokens to one expert, experts
with no tokens, ties in router scores, top-k = number of experts, groups larger than a row
tile, a single token."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedllm.model.layers.moe import RouterSpec, StackedExperts, group_by_expert, select_experts
from pagedllm.model.layers.moe.grouped import offsets_of

H, INTER, E = 256, 256, 6


def dense_weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    gate_up = torch.randn(E, 2 * INTER, H, generator=g) * H**-0.5
    down = torch.randn(E, H, INTER, generator=g) * INTER**-0.5
    return gate_up, down


def fp32_experts(gate_up: torch.Tensor, down: torch.Tensor) -> StackedExperts:
    experts = StackedExperts(E, H, INTER)
    with torch.no_grad():
        experts.gate_up_proj.copy_(gate_up)
        experts.down_proj.copy_(down)
    experts.finalize()
    assert experts.packed is not None, "the grouped fp32 kernel must be built here"
    return experts


def reference_forward(experts: StackedExperts, x, weights, ids) -> torch.Tensor:
    """The layer's forward with the per-expert torch loop in place of the grouped kernels."""
    k = ids.shape[1]
    order, counts = group_by_expert(ids, E)
    out = experts.reference(x[order // k], counts)
    out.mul_(weights.reshape(-1)[order].unsqueeze(1))
    return torch.zeros_like(x).index_add_(0, order // k, out)


def per_token(gate_up, down, x, weights, ids) -> torch.Tensor:
    """sum_k w[t, k] * expert_{ids[t, k]}(x[t]), one token and one expert at a time."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            gate, up = (gate_up[e] @ x[t]).chunk(2)
            out[t] += w * (down[e] @ (F.silu(gate) * up))
    return out


def routing_cases() -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """name -> (x, weights, ids) for every edge case of the issue."""
    g = torch.Generator().manual_seed(7)
    cases = {}
    x = torch.randn(37, H, generator=g)
    cases["random top-2"] = (x, *select_experts(torch.randn(37, E, generator=g),
                                                RouterSpec(E, 2, renormalize=True)))
    cases["all to one expert"] = (x[:20], torch.rand(20, 1, generator=g),
                                  torch.full((20, 1), 2))
    ids = torch.stack([torch.zeros(16, dtype=torch.long),
                       torch.tensor([1, 3, 4] * 5 + [1])], dim=1)  # 2 and 5 get nothing
    cases["experts with no tokens"] = (x[:16], torch.rand(16, 2, generator=g), ids)
    tied = torch.randn(12, E, generator=g)
    tied[:, 3] = tied[:, 1] = 5.0  # equal scores: the lower expert first, as HF's topk
    cases["ties in router scores"] = (x[:12], *select_experts(tied, RouterSpec(E, 2, renormalize=True)))
    cases["top-k = experts"] = (x[:9], *select_experts(torch.randn(9, E, generator=g),
                                                       RouterSpec(E, E, renormalize=False)))
    big = torch.randn(300, H, generator=g)  # 600 rows: groups longer than a row tile
    cases["prefill 300 tokens"] = (big, *select_experts(torch.randn(300, 2, generator=g)
                                                        @ torch.randn(2, E, generator=g),
                                                        RouterSpec(E, 2, renormalize=True)))
    cases["one token"] = (x[:1], torch.tensor([[0.7, 0.3]]), torch.tensor([[4, 1]]))
    return cases


CASES = routing_cases()


@pytest.fixture(scope="module")
def fp32():
    gate_up, down = dense_weights()
    return fp32_experts(gate_up, down), gate_up, down


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_grouped_equals_per_expert_reference(fp32, case) -> None:
    experts, gate_up, down = fp32
    x, weights, ids = CASES[case]
    got = experts(x, weights, ids)
    torch.testing.assert_close(got, reference_forward(experts, x, weights, ids),
                               rtol=1e-5, atol=1e-5)
    if x.shape[0] <= 37:
        torch.testing.assert_close(got, per_token(gate_up, down, x, weights, ids),
                                   rtol=1e-5, atol=1e-5)


def test_fp32_grouped_is_bit_identical_to_each_experts_packed_linear(fp32) -> None:
    """The same panels and micro-kernel as the dense packed linear, one expert at a time."""
    from pagedllm.kernels import cpu_ops

    experts, _, _ = fp32
    ops = cpu_ops.load()
    counts = [5, 0, 17, 1, 0, 9]
    xs = torch.randn(sum(counts), H)
    got = experts.packed[0].run(xs, offsets_of(counts))
    start = 0
    for e, n in enumerate(counts):
        want = ops.packed_linear(xs[start:start + n].contiguous(), experts.packed[0].packed[e],
                                 2 * INTER, None)
        assert torch.equal(got[start:start + n], want), f"expert {e}"
        start += n


def test_fp32_packing_frees_the_dense_copy(fp32) -> None:
    experts, gate_up, down = fp32
    assert experts.gate_up_proj.numel() == 0 and experts.down_proj.numel() == 0
    assert experts.weight_nbytes >= (gate_up.numel() + down.numel()) * 4
    assert torch.equal(experts.packed[1].dense(3), down[3])


def test_bad_offsets_are_a_clear_error(fp32) -> None:
    experts, _, _ = fp32
    xs = torch.randn(4, H)
    with pytest.raises(RuntimeError, match="offsets must run from 0 to the 4 rows"):
        experts.packed[0].run(xs, offsets_of([1, 1, 1, 0, 0, 0]))
    with pytest.raises(RuntimeError, match="E \\+ 1 = 7 row starts"):
        experts.packed[0].run(xs, offsets_of([4]))


GGUF_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"]


def quantized_experts(qtype_name: str, int8_activations: bool) -> StackedExperts:
    """Experts whose gate / up / down load as GGUF blocks (random bytes where gguf-py has no
    quantizer), finalized: stacked for the grouped kernel of their layout."""
    from gguf import GGMLQuantizationType as T

    from pagedllm.model.layers.quant.gguf import GGUFWeight
    from pagedllm.model.layers.quant.gguf_a8_panels import a8_weight_from_blocks
    from tests.model.quant.test_gguf_formats import random_blocks

    qtype = T[qtype_name]
    build = a8_weight_from_blocks if int8_activations else GGUFWeight.from_blocks
    experts = StackedExperts(E, H, INTER)
    for e in range(E):
        for i, (part, shape) in enumerate((("gate", (INTER, H)), ("up", (INTER, H)),
                                           ("down", (H, INTER)))):
            blocks = random_blocks(qtype, *shape, seed=10 * e + i)
            experts.load_expert(e, part, build(qtype, blocks, shape))
    experts.finalize()
    assert experts.quant is not None and experts.quant.grouped is not None
    return experts


@pytest.mark.parametrize("int8_activations", [False, True], ids=["fp32-act", "int8-act"])
@pytest.mark.parametrize("qtype", GGUF_TYPES)
def test_gguf_grouped_is_bit_identical_to_each_experts_linear(qtype, int8_activations) -> None:
    """Every routing case, through the layer: the grouped kernel runs each expert's own dot
    products (int8 activations for small groups, exact panels for large ones)."""
    experts = quantized_experts(qtype, int8_activations)
    suffix = "+a8" if int8_activations else ""
    stored = "Q8_0" if int8_activations and qtype == "Q5_0" else qtype  # in Q8_0's panels
    assert experts.quant.format == f"gguf:{stored}{suffix}"
    for case, (x, weights, ids) in CASES.items():
        x = x * 0.01  # random K-quant bytes make weights up to ~100: keep the SiLU in range
        got = experts(x, weights, ids)
        assert got.isfinite().all(), case
        want = reference_forward(experts, x, weights, ids)
        assert torch.equal(got, want), f"{case}: max diff {(got - want).abs().max():.3g}"


def test_gguf_stack_holds_each_experts_bytes_once() -> None:
    experts = quantized_experts("Q4_K", False)
    grouped_bytes = sum(g.nbytes for g in experts.quant.grouped)
    assert experts.weight_nbytes == grouped_bytes
    down = experts.quant.down
    assert down[3].q.data_ptr() == experts.quant.grouped[1].fields["q"][3].data_ptr()


@pytest.mark.parametrize("w8a8", [False, True], ids=["int8", "w8a8"])
def test_int8_grouped_is_bit_identical_to_each_experts_linear(w8a8) -> None:
    """int8 experts (`--quantization int8`, weight-only or W8A8): every routing case."""
    from pagedllm.model.layers.quant.int8 import Int8Weight

    gate_up, down = dense_weights(seed=3)
    experts = StackedExperts(E, H, INTER)
    for e in range(E):
        experts.load_expert(e, "gate", Int8Weight.quantize(gate_up[e, :INTER], w8a8=w8a8))
        experts.load_expert(e, "up", Int8Weight.quantize(gate_up[e, INTER:], w8a8=w8a8))
        experts.load_expert(e, "down", Int8Weight.quantize(down[e], w8a8=w8a8))
    experts.finalize()
    assert experts.quant is not None and experts.quant.grouped is not None
    assert experts.quant.down[2].qp.data_ptr() == experts.quant.grouped[1].fields["qp"][2].data_ptr()
    for case, (x, weights, ids) in CASES.items():
        got = experts(x, weights, ids)
        want = reference_forward(experts, x, weights, ids)
        assert torch.equal(got, want), f"{case}: max diff {(got - want).abs().max():.3g}"
        if x.shape[0] <= 37 and not w8a8:  # and close to the fp32 experts
            torch.testing.assert_close(got, per_token(gate_up, down, x, weights, ids),
                                       rtol=0.05, atol=0.05)


def test_an_empty_batch(fp32) -> None:
    experts, _, _ = fp32
    out = experts(torch.empty(0, H), torch.empty(0, 2), torch.empty(0, 2, dtype=torch.long))
    assert out.shape == (0, H)


def test_experts_of_mixed_formats_run_the_per_expert_loop() -> None:
    """No grouped kernel takes Q8_0 and Q4_0 experts together: the layer still runs them,
    each with its own kernel, and says so by having no stack."""
    from gguf import GGMLQuantizationType as T

    from pagedllm.model.layers.quant.gguf import GGUFWeight
    from tests.model.quant.test_gguf_formats import random_blocks

    experts = StackedExperts(E, H, INTER)
    for e in range(E):
        qtype = T.Q8_0 if e == 0 else T.Q4_0
        for i, (part, shape) in enumerate((("gate", (INTER, H)), ("up", (INTER, H)),
                                           ("down", (H, INTER)))):
            blocks = random_blocks(qtype, *shape, seed=10 * e + i)
            experts.load_expert(e, part, GGUFWeight.from_blocks(qtype, blocks, shape))
    experts.finalize()
    assert experts.quant is not None and experts.quant.grouped is None
    x, weights, ids = CASES["random top-2"]
    x = x * 0.05  # outputs of order 1: fp32 sums in another order agree to ~1e-6
    dense_gate_up = torch.stack([w.dequantize() for w in experts.quant.gate_up])
    dense_down = torch.stack([w.dequantize() for w in experts.quant.down])
    torch.testing.assert_close(experts(x, weights, ids),
                               per_token(dense_gate_up, dense_down, x, weights, ids),
                               rtol=1e-4, atol=1e-4)


def test_w8a8_grouped_on_partial_blocks_and_panels() -> None:
    """W8A8's grouped kernel where K is not whole 32-value activation blocks and N not whole
    panels, with an expert's group longer than a row tile: bit for bit each expert's own
    w8a8_linear (the per-32 quantizer and micro-kernel of kernels/quant_w8a8_cpu.cpp)."""
    from pagedllm.model.layers.moe.grouped_quant import stack_quantized
    from pagedllm.model.layers.quant.int8 import Int8Weight

    n, k, experts_n = 45, 72, 3
    g = torch.Generator().manual_seed(11)
    weights = [Int8Weight.quantize(torch.randn(n, k, generator=g), w8a8=True)
               for _ in range(experts_n)]
    stacked = stack_quantized(weights)
    assert stacked is not None, "the grouped W8A8 kernel must be built here"
    grouped, views = stacked
    counts = [3, 0, 250]  # expert 2's 250 rows span two row tiles
    xs = torch.randn(sum(counts), k, generator=g)
    got = grouped.run(xs, offsets_of(counts))
    starts = [0, 3, 3, 253]
    for e in range(experts_n):
        rows = slice(starts[e], starts[e + 1])
        assert torch.equal(got[rows], views[e].linear(xs[rows].contiguous()))
        assert torch.equal(views[e].dequantize(), weights[e].dequantize())


def test_forced_triton_keeps_the_dense_stacks(monkeypatch) -> None:
    """Where the Triton fused-MoE kernel runs the experts (forced into the interpreter on
    CPU), `finalize` leaves them dense for it (moe/dispatch.py reads gate_up_proj /
    down_proj), and the Triton path equals the grouped C++ kernel's."""
    from pagedllm.model.layers.moe.dispatch import run_experts

    gate_up, down = dense_weights(seed=5)
    grouped = fp32_experts(gate_up, down)
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    experts = StackedExperts(E, H, INTER)
    with torch.no_grad():
        experts.gate_up_proj.copy_(gate_up)
        experts.down_proj.copy_(down)
    experts.finalize()
    assert experts.packed is None and experts.dense
    assert torch.equal(experts.gate_up_proj, gate_up)
    x, weights, ids = CASES["random top-2"]
    torch.testing.assert_close(run_experts(experts, x, weights, ids, E),
                               run_experts(grouped, x, weights, ids, E), rtol=1e-5, atol=1e-5)
