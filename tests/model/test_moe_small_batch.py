"""StackedExperts' small-batch path (decode: tokens x k <= SMALL_BATCH assignments grouped on
the host, model/layers/moe/experts.py) equals its general path (argsort + bincount +
index_add_) bit for bit, fp32 packed and int8 experts, over the routing edge cases: ties,
all tokens to one expert, top-k = number of experts, one token, the bound itself; an empty
batch and bad ids."""

from __future__ import annotations

import pytest
import torch

from pagedllm.model.layers.moe import RouterSpec, StackedExperts, select_experts
from pagedllm.model.layers.moe import experts as experts_mod
from tests.model.test_moe_grouped import INTER, E, H, dense_weights, fp32_experts, reference_forward


def small_cases() -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(8, H, generator=g)
    tied = torch.randn(3, E, generator=g)
    tied[:, 4] = tied[:, 0] = 3.0
    return {
        "one token top-2": (x[:1], *select_experts(torch.randn(1, E, generator=g),
                                                   RouterSpec(E, 2, renormalize=True))),
        "one token, ids descending": (x[:1], torch.tensor([[0.6, 0.4]]),
                                      torch.tensor([[5, 0]])),
        "one token, ids ascending (no gather)": (x[:1], torch.tensor([[0.3, 0.7]]),
                                                 torch.tensor([[1, 4]])),
        "one token top-k = experts": (x[:1], *select_experts(torch.randn(1, E, generator=g),
                                                             RouterSpec(E, E))),
        "ties in router scores": (x[:3], *select_experts(tied, RouterSpec(E, 2))),
        "all to one expert": (x, torch.rand(8, 1, generator=g), torch.full((8, 1), 3)),
        "the same expert twice across tokens": (x[:4], torch.rand(4, 2, generator=g),
                                                torch.tensor([[1, 2], [2, 1], [1, 5], [5, 2]])),
        "at the bound": (x, *select_experts(torch.randn(8, E, generator=g),
                                            RouterSpec(E, experts_mod.SMALL_BATCH // 8,
                                                       renormalize=True))),
    }


CASES = small_cases()


def general(experts: StackedExperts, x, weights, ids, monkeypatch) -> torch.Tensor:
    with monkeypatch.context() as m:
        m.setattr(experts_mod, "SMALL_BATCH", 0)
        return experts(x, weights, ids)


@pytest.fixture(scope="module")
def fp32():
    return fp32_experts(*dense_weights())


@pytest.fixture(scope="module")
def int8():
    from pagedllm.model.layers.quant.int8 import Int8Weight

    gate_up, down = dense_weights(seed=5)
    experts = StackedExperts(E, H, INTER)
    for e in range(E):
        experts.load_expert(e, "gate", Int8Weight.quantize(gate_up[e, :INTER]))
        experts.load_expert(e, "up", Int8Weight.quantize(gate_up[e, INTER:]))
        experts.load_expert(e, "down", Int8Weight.quantize(down[e]))
    experts.finalize()
    assert experts.quant is not None and experts.quant.grouped is not None
    return experts


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_small_batch_path_equals_the_general_path(kind, case, request, monkeypatch) -> None:
    experts = request.getfixturevalue(kind)
    x, weights, ids = CASES[case]
    assert ids.numel() <= experts_mod.SMALL_BATCH
    got = experts(x, weights, ids)
    want = general(experts, x, weights, ids, monkeypatch)
    assert torch.equal(got, want), f"{case}: max diff {(got - want).abs().max():.3g}"
    ref = reference_forward(experts, x, weights, ids)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


def test_host_grouping_is_a_stable_sort_by_expert() -> None:
    flat = [3, 1, 3, 0, 1, 3]
    assert experts_mod.group_small(flat, 4) == [3, 1, 4, 0, 2, 5]
    order, _ = experts_mod.group_by_expert(torch.tensor(flat), 4)
    assert order.tolist() == experts_mod.group_small(flat, 4)


def test_an_empty_batch_and_bad_ids(fp32) -> None:
    out = fp32(torch.empty(0, H), torch.empty(0, 2), torch.empty(0, 2, dtype=torch.long))
    assert out.shape == (0, H)
    with pytest.raises(ValueError, match="not all in"):
        fp32(torch.randn(1, H), torch.tensor([[0.5, 0.5]]), torch.tensor([[1, E]]))
