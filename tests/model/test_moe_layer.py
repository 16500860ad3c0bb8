"""The fused MoE layer (model/layers/moe/) against a per-token, per-expert reference and
against HF transformers' own MoE blocks and routers (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedllm.model.layers.moe import (
    FusedMoE,
    RouterSpec,
    StackedExperts,
    group_by_expert,
    select_experts,
)

H, INTER = 32, 24


def reference(experts: StackedExperts, x, weights, ids) -> torch.Tensor:
    """sum_k w[t, k] * expert_{ids[t, k]}(x[t]), one token and one expert at a time."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            gate, up = (experts.gate_up_proj[e] @ x[t]).chunk(2)
            out[t] += w * (experts.down_proj[e] @ (F.silu(gate) * up))
    return out


def random_experts(num_experts: int, seed: int = 0) -> StackedExperts:
    torch.manual_seed(seed)
    experts = StackedExperts(num_experts, H, INTER)
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.3)
        experts.down_proj.normal_(0, 0.3)
    return experts


def check(experts, x, weights, ids) -> None:
    got = experts(x, weights, ids)
    torch.testing.assert_close(got, reference(experts, x, weights, ids), atol=1e-5, rtol=1e-5)


def test_random_routing_matches_reference() -> None:
    experts = random_experts(8)
    x = torch.randn(37, H)
    weights, ids = select_experts(torch.randn(37, 8), RouterSpec(8, 2, renormalize=True))
    check(experts, x, weights, ids)


def test_all_tokens_to_one_expert() -> None:
    experts = random_experts(4)
    x = torch.randn(20, H)
    ids = torch.full((20, 1), 2)
    check(experts, x, torch.rand(20, 1), ids)
    _, counts = group_by_expert(ids, 4)
    assert counts == [0, 0, 20, 0]
    # ... and through the router: a gate that prefers expert 2 for every (positive) token.
    layer = FusedMoE(H, INTER, RouterSpec(4, 2, renormalize=True))
    layer.experts = experts
    with torch.no_grad():
        layer.gate.weight.copy_(torch.tensor([0.0, -1.0, 5.0, 1.0]).unsqueeze(1).expand(4, H))
    layer.gate.finalize()
    x = torch.rand(20, H)
    weights, ids = select_experts(layer.gate(x), layer.router)
    assert (ids[:, 0] == 2).all() and (ids[:, 1] == 3).all()
    torch.testing.assert_close(layer(x), reference(experts, x, weights, ids), atol=1e-5, rtol=1e-5)


def test_an_expert_with_no_tokens() -> None:
    experts = random_experts(6)
    x = torch.randn(16, H)
    # Experts 2 and 5 get nothing; 0 is every token's first choice.
    ids = torch.stack([torch.zeros(16, dtype=torch.long), torch.tensor([1, 3, 4] * 5 + [1])], dim=1)
    order, counts = group_by_expert(ids, 6)
    assert counts == [16, 6, 0, 5, 5, 0]
    assert ids.reshape(-1)[order].tolist() == sorted(ids.reshape(-1).tolist())
    check(experts, x, torch.rand(16, 2), ids)


def test_router_ties_pick_the_lower_expert_as_hf_does() -> None:
    """Experts 1 and 3 have identical router rows, so every token scores them equally."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter

    torch.manual_seed(2)
    gate = torch.randn(5, H)
    gate[1] += 10.0  # far above the others: both are chosen by every (positive) token
    gate[3] = gate[1]
    x = torch.rand(12, H)
    logits = x @ gate.T
    assert torch.equal(logits[:, 1], logits[:, 3])
    weights, ids = select_experts(logits, RouterSpec(5, 2, renormalize=True))
    assert ids.tolist() == [[1, 3]] * 12
    hf = MixtralTopKRouter(MixtralConfig(hidden_size=H, num_local_experts=5, num_experts_per_tok=2))
    with torch.no_grad():
        hf.weight.copy_(gate)
    _, hf_weights, hf_ids = hf(x)
    assert torch.equal(ids, hf_ids)
    torch.testing.assert_close(weights, hf_weights)
    check(random_experts(5), x, weights, ids)


@pytest.mark.parametrize("renormalize", [True, False])
def test_top_k_equals_number_of_experts(renormalize) -> None:
    experts = random_experts(4)
    x = torch.randn(9, H)
    logits = torch.randn(9, 4)
    weights, ids = select_experts(logits, RouterSpec(4, 4, renormalize=renormalize))
    assert sorted(ids[0].tolist()) == [0, 1, 2, 3]
    torch.testing.assert_close(weights.sum(-1), torch.ones(9))  # softmax sums to 1 anyway
    dense = torch.zeros_like(x)
    probs = logits.softmax(-1)
    for e in range(4):  # every expert on every token, weighted by its probability
        gate, up = (x @ experts.gate_up_proj[e].T).chunk(2, -1)
        dense += probs[:, e : e + 1] * ((F.silu(gate) * up) @ experts.down_proj[e].T)
    torch.testing.assert_close(experts(x, weights, ids), dense, atol=1e-5, rtol=1e-5)


def _copy_hf_block(layer: FusedMoE, hf_block) -> None:
    with torch.no_grad():
        layer.gate.weight.copy_(hf_block.gate.weight)
        layer.experts.gate_up_proj.copy_(hf_block.experts.gate_up_proj)
        layer.experts.down_proj.copy_(hf_block.experts.down_proj)
        if layer.shared_expert is not None:
            shared = hf_block.shared_expert
            layer.shared_expert.gate_up_proj.weight.copy_(
                torch.cat([shared.gate_proj.weight, shared.up_proj.weight])
            )
            layer.shared_expert.down_proj.weight.copy_(shared.down_proj.weight)
            layer.shared_expert_gate.weight.copy_(hf_block.shared_expert_gate.weight)
    for module in layer.modules():
        if hasattr(module, "finalize"):
            module.finalize()


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"])
def test_block_matches_hf_sparse_moe_block(family) -> None:
    """FusedMoE built from each family's config equals HF's block with the same weights."""
    import transformers
    from transformers.models.mixtral import modeling_mixtral
    from transformers.models.olmoe import modeling_olmoe
    from transformers.models.qwen2_moe import modeling_qwen2_moe
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    from pagedllm.model.layers.moe import MoESpec

    common = dict(hidden_size=H, num_experts_per_tok=3, num_hidden_layers=1)
    cfg, block = {
        "mixtral": (
            transformers.MixtralConfig(**common, intermediate_size=INTER, num_local_experts=6),
            modeling_mixtral.MixtralSparseMoeBlock,
        ),
        "qwen2_moe": (
            transformers.Qwen2MoeConfig(
                **common,
                moe_intermediate_size=INTER,
                num_experts=6,
                norm_topk_prob=False,
                shared_expert_intermediate_size=40,
            ),
            modeling_qwen2_moe.Qwen2MoeSparseMoeBlock,
        ),
        "qwen3_moe": (
            transformers.Qwen3MoeConfig(
                **common, moe_intermediate_size=INTER, num_experts=6, norm_topk_prob=True
            ),
            modeling_qwen3_moe.Qwen3MoeSparseMoeBlock,
        ),
        "olmoe": (
            transformers.OlmoeConfig(**common, intermediate_size=INTER, num_experts=6),
            modeling_olmoe.OlmoeSparseMoeBlock,
        ),
    }[family]
    torch.manual_seed(3)
    hf_block = block(cfg).eval()
    with torch.no_grad():
        for p in hf_block.parameters():
            p.normal_(0, 0.5)
    layer = FusedMoE.from_spec(MoESpec.from_config(cfg))
    _copy_hf_block(layer, hf_block)
    x = torch.randn(2, 21, H)
    with torch.no_grad():
        expected = hf_block(x)
    torch.testing.assert_close(layer(x.view(-1, H)), expected.view(-1, H), atol=1e-5, rtol=1e-5)


def test_sigmoid_grouped_router_with_expert_bias_matches_deepseek_v3() -> None:
    """Sigmoid scores, expert bias steering the choice only, 4 groups of which 2 survive,
    renormalized and scaled: HF's DeepseekV3TopkRouter picks the same experts and weights."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    cfg = DeepseekV3Config(
        hidden_size=H,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        norm_topk_prob=True,
        routed_scaling_factor=2.5,
    )
    hf = DeepseekV3TopkRouter(cfg)
    torch.manual_seed(4)
    with torch.no_grad():
        hf.weight.normal_()
        hf.e_score_correction_bias.normal_(0, 0.5)
    x = torch.randn(33, H)
    hf_logits, hf_weights, hf_ids = hf(x)
    spec = RouterSpec(
        16, 4, scoring="sigmoid", renormalize=True, num_groups=4, topk_groups=2, scale=2.5
    )
    weights, ids = select_experts(hf_logits, spec, hf.e_score_correction_bias)
    # HF's top-k is unsorted: compare (expert, weight) pairs per token.
    for t in range(33):
        got = sorted(zip(ids[t].tolist(), weights[t].tolist(), strict=True))
        want = sorted(zip(hf_ids[t].tolist(), hf_weights[t].tolist(), strict=True))
        assert [e for e, _ in got] == [e for e, _ in want]
        assert [w for _, w in got] == pytest.approx([w for _, w in want], abs=1e-6)
    # The bias changed some choices: without it the experts differ.
    plain = select_experts(hf_logits, spec)[1]
    assert not torch.equal(plain.sort(-1).values, ids.sort(-1).values)


def test_fused_moe_with_expert_bias() -> None:
    layer = FusedMoE(
        H, INTER, RouterSpec(8, 2, scoring="sigmoid", renormalize=True), with_expert_bias=True
    )
    layer.experts = random_experts(8)
    with torch.no_grad():
        layer.gate.weight.normal_()
        layer.expert_bias.copy_(torch.tensor([0, 0, 0, 0, 0, 0, 0, 100.0]))
    layer.gate.finalize()
    x = torch.randn(10, H)
    weights, ids = select_experts(layer.gate(x), layer.router, layer.expert_bias)
    assert (ids == 7).any(-1).all()  # the bias makes expert 7 everyone's choice
    torch.testing.assert_close(
        layer(x), reference(layer.experts, x, weights, ids), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(num_experts=4, top_k=5), r"top_k\) must be in \[1, 4\]"),
        (dict(num_experts=4, top_k=0), r"top_k\) must be in \[1, 4\]"),
        (dict(num_experts=4, top_k=2, scoring="relu"), "scoring 'relu'"),
        (dict(num_experts=6, top_k=2, num_groups=4), "4 expert groups do not divide 6"),
        (dict(num_experts=8, top_k=2, num_groups=4, topk_groups=5), r"topk_groups must be in"),
        (dict(num_experts=8, top_k=6, num_groups=4, topk_groups=2), "fewer than top_k = 6"),
    ],
)
def test_router_spec_is_validated(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        RouterSpec(**kwargs)


def test_expert_loading_checks_shapes_and_parts() -> None:
    experts = StackedExperts(2, H, INTER)
    gate, up, down = torch.randn(INTER, H), torch.randn(INTER, H), torch.randn(H, INTER)
    for part, tensor in (("gate", gate), ("up", up), ("down", down)):
        experts.load_expert(1, part, tensor)
    assert torch.equal(experts.gate_up_proj[1], torch.cat([gate, up]))
    assert torch.equal(experts.down_proj[1], down)
    with pytest.raises(ValueError, match=r"shape \(24, 32\); the layer expects \(32, 24\)"):
        experts.load_expert(0, "down", gate)
    with pytest.raises(ValueError, match=r"outside this layer's experts \[0, 2\)"):
        experts.load_expert(2, "gate", gate)
    shard = StackedExperts(2, H, INTER, first_expert=2)  # one rank's under expert parallelism
    shard.load_expert(3, "down", down)
    assert torch.equal(shard.down_proj[1], down)
    with pytest.raises(ValueError, match=r"expert 1 is outside this layer's experts \[2, 4\)"):
        shard.load_expert(1, "down", down)
    with pytest.raises(ValueError, match="'w4' is not one of"):
        experts.load_expert(0, "w4", gate)


def _int8_experts(experts: StackedExperts, skip: tuple[int, str] | None = None):
    """(the experts with int8 weights, the same experts holding the dequantized weights)."""
    from pagedllm.model.layers.quant.int8 import Int8Weight

    n = experts.num_experts
    quantized, dequantized = StackedExperts(n, H, INTER), StackedExperts(n, H, INTER)
    for e in range(n):
        gate, up = experts.gate_up_proj[e].chunk(2)
        for part, w in (("gate", gate), ("up", up), ("down", experts.down_proj[e])):
            q = Int8Weight.quantize(w.contiguous())
            quantized.load_expert(e, part, w if (e, part) == skip else q)
            dequantized.load_expert(e, part, q.dequantize())
    return quantized, dequantized


def test_quantized_experts_run_their_format() -> None:
    quantized, dequantized = _int8_experts(random_experts(4))
    quantized.finalize()
    assert quantized.quant.format == "int8" and quantized.gate_up_proj.numel() == 0
    # int8 rows plus an fp32 scale per row (of 24 or 32 values), against fp32
    assert quantized.weight_nbytes == quantized.quant.nbytes < dequantized.weight_nbytes / 2.5
    x = torch.randn(23, H)
    weights, ids = select_experts(torch.randn(23, 4), RouterSpec(4, 2, renormalize=True))
    torch.testing.assert_close(
        quantized(x, weights, ids), reference(dequantized, x, weights, ids), atol=1e-4, rtol=1e-4
    )


def test_partly_quantized_experts_are_refused() -> None:
    quantized, _ = _int8_experts(random_experts(2), skip=(1, "up"))
    with pytest.raises(ValueError, match=r"partly quantized: \[\(1, 'up'\)\] are not"):
        quantized.finalize()
