"""model/layers/moe/dispatch.py: under expert parallelism each rank runs only the assignments
routed to the experts it holds; the ranks' outputs summed (what the MoE block's all-reduce
does) equal one rank holding every expert. On the CPU path and on the Triton kernel
(forced into Triton's interpreter, as tests/kernels/test_triton_fused_moe.py)."""

from __future__ import annotations

import pytest
import torch

from pagedllm.model.layers.moe import RouterSpec, StackedExperts, select_experts
from pagedllm.model.layers.moe.dispatch import run_experts

E, H, INTER = 4, 32, 24


def shard(full: StackedExperts, first: int, count: int) -> StackedExperts:
    """The experts [first, first + count) of `full`, as a rank holds them."""
    part = StackedExperts(count, H, INTER, first_expert=first)
    with torch.no_grad():
        for e in range(first, first + count):
            part.load_expert(e, "gate", full.gate_up_proj[e, :INTER])
            part.load_expert(e, "up", full.gate_up_proj[e, INTER:])
            part.load_expert(e, "down", full.down_proj[e])
    return part


@pytest.mark.parametrize("path", ["cpu", "triton"])
@pytest.mark.parametrize("bias", [None, "rank1_only"])
def test_ranks_sum_to_the_whole_layer(path, bias, monkeypatch):
    if path == "triton":
        monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "triton")
    torch.manual_seed(0)
    full = StackedExperts(E, H, INTER)
    with torch.no_grad():
        full.gate_up_proj.normal_(0, 0.3)
        full.down_proj.normal_(0, 0.3)
    x = torch.randn(19, H)
    logits = torch.randn(19, E)
    if bias == "rank1_only":  # no token routed to rank 0's experts: it adds zeros
        logits[:, :2] -= 100.0
    weights, ids = select_experts(logits, RouterSpec(E, 2, renormalize=True))
    whole = run_experts(full, x, weights, ids, E)
    parts = [run_experts(shard(full, first, 2), x, weights, ids, E) for first in (0, 2)]
    if bias == "rank1_only":
        assert not parts[0].any()
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=0, atol=1e-5)
