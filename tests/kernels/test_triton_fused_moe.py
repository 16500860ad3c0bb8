"""The Triton fused-MoE kernel (pagedllm/kernels/triton/fused_moe.py) against the per-expert
torch loop of `StackedExperts.forward`, in Triton's interpreter on a machine without GPU
(tests/conftest.py sets TRITON_INTERPRET=1), compiled on a GPU. The routings include the edge
cases of the block-aligned sort: every token on one expert, experts with no tokens, top-k =
number of experts, one token, M blocks that are partly padding."""

from __future__ import annotations

import pytest
import torch
import triton  # noqa: F401  - a missing triton must fail these tests, not skip them

from pagedllm.kernels.triton.fused_moe import align_by_expert, fused_moe
from pagedllm.model.layers.moe import RouterSpec, StackedExperts, select_experts

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def experts(num_experts: int, hidden: int, inter: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    m = StackedExperts(num_experts, hidden, inter)
    with torch.no_grad():
        m.gate_up_proj.copy_(torch.randn(m.gate_up_proj.shape, generator=g) / hidden ** 0.5)
        m.down_proj.copy_(torch.randn(m.down_proj.shape, generator=g) / inter ** 0.5)
    return m.to(device=DEVICE, dtype=dtype)


def routing(kind: str, tokens: int, num_experts: int, top_k: int, hidden: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    logits = torch.randn(tokens, num_experts, generator=g)
    if kind == "one_expert":  # every token's first choice is expert 2
        logits[:, 2] += 100.0
    elif kind == "empty_expert":  # experts 0 and 3 never chosen
        logits[:, [0, 3]] -= 100.0
    weights, ids = select_experts(logits, RouterSpec(num_experts, top_k, renormalize=True))
    return x.to(DEVICE), weights.to(DEVICE), ids.to(DEVICE)


@pytest.mark.parametrize(("kind", "tokens", "num_experts", "top_k"), [
    ("random", 37, 8, 2),           # several M blocks per expert, partly padded
    ("one_expert", 20, 4, 1),       # all rows on one expert, the others have none
    ("empty_expert", 9, 6, 2),
    ("random", 5, 4, 4),            # top-k = number of experts
    ("random", 1, 8, 2),            # one decode token
])
def test_fused_moe_matches_per_expert_loop(kind, tokens, num_experts, top_k):
    hidden, inter = 40, 24  # not multiples of the blocks: masked K and N edges
    m = experts(num_experts, hidden, inter)
    x, weights, ids = routing(kind, tokens, num_experts, top_k, hidden)
    if kind == "one_expert":
        assert (ids[:, 0] == 2).all()
    if kind == "empty_expert":
        assert not torch.isin(ids, torch.tensor([0, 3], device=DEVICE)).any()
    want = m(x, weights, ids)
    got = fused_moe(x, m.gate_up_proj, m.down_proj, weights, ids)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_fused_moe_bf16_close_to_fp32():
    m = experts(4, 64, 32)
    x, weights, ids = routing("random", 12, 4, 2, 64)
    want = m(x, weights, ids)
    got = fused_moe(x.bfloat16(), m.gate_up_proj.bfloat16(), m.down_proj.bfloat16(),
                    weights, ids)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.05)


def test_experts_held_elsewhere_are_skipped():
    """Expert parallelism: ids of -1 (experts held by another rank) add nothing; the rest is
    the per-expert loop over the held experts' assignments."""
    m = experts(4, 40, 24)
    x, weights, ids = routing("random", 13, 4, 2, 40)
    held = ids < 2
    local = torch.where(held, ids, -1)
    want = m(x, torch.where(held, weights, 0.0), torch.where(held, ids, 0))
    got = fused_moe(x, m.gate_up_proj, m.down_proj, weights, local)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    nothing = fused_moe(x, m.gate_up_proj, m.down_proj, weights, torch.full_like(ids, -1))
    assert not nothing.any()


def test_align_by_expert_blocks():
    ids = torch.tensor([[2, 0], [0, 1], [2, 0]])
    sorted_ids, block_expert, total = align_by_expert(ids, 4, 4)
    n = ids.numel()
    assert int(total) == 12
    assert sorted_ids[:12].tolist() == [1, 2, 5, n, 3, n, n, n, 0, 4, n, n]
    assert block_expert[:3].tolist() == [0, 1, 2]
    assert (sorted_ids[12:] == n).all()
    skipped = torch.tensor([[2, -1], [-1, 1], [2, 0]])  # -1: held by another rank
    sorted_ids, block_expert, total = align_by_expert(skipped, 4, 4)
    assert int(total) == 12
    assert sorted_ids[:12].tolist() == [5, n, n, n, 3, n, n, n, 0, 4, n, n]
    assert block_expert[:3].tolist() == [0, 1, 2]


def test_zero_tokens_and_bad_shapes():
    m = experts(4, 16, 8)
    x = torch.empty(0, 16, device=DEVICE)
    ids = torch.empty(0, 2, dtype=torch.int64, device=DEVICE)
    assert fused_moe(x, m.gate_up_proj, m.down_proj, ids.float(), ids).shape == (0, 16)
    with pytest.raises(ValueError, match="do not fit"):
        fused_moe(torch.zeros(3, 12, device=DEVICE), m.gate_up_proj, m.down_proj,
                  torch.zeros(3, 2, device=DEVICE), torch.zeros(3, 2, dtype=torch.int64,
                                                                  device=DEVICE))


def test_moe_model_on_the_triton_path_matches_hf(monkeypatch, tmp_path, tiny_tokenizer,
                                                 make_llm, hf_reference):
    """A Qwen3-MoE model with the whole CUDA path forced onto Triton's kernels (attention,
    norms, RoPE and the MoE layers' `fused_moe`, model/layers/moe/dispatch.py): HF's greedy
    tokens, with a chunk after cached context."""
    from pagedllm import SamplingParams
    from pagedllm.kernels.triton import fused_moe as module
    from tests.model.family_checkpoints import make_family_checkpoint

    calls = []
    real = module.fused_moe
    monkeypatch.setattr(module, "fused_moe", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "triton")
    model_dir = make_family_checkpoint(tmp_path / "qwen3_moe", "qwen3_moe", tiny_tokenizer,
                                       seed=12)
    llm = make_llm(model_dir, block_size=8, max_num_batched_tokens=16)
    prompts = [[3, 8, 1, 9], list(range(2, 23))]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.outputs[0].token_ids == hf_reference.greedy(model_dir, prompt, 4)[0]
    assert calls  # the MoE layers ran the Triton kernel
