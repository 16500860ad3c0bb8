"""TP=2 against TP=1 for the mixture-of-experts families (tiny random checkpoints of
tests/model/family_checkpoints.py: 4 experts, top-2), both ways of splitting the experts
(distributed/expert_sharding.py): tensor-parallel experts (1/2 of every expert's width) and
expert parallelism (`enable_expert_parallel`: experts 0-1 on rank 0, 2-3 on rank 1).
Mixtral (w1/w3/w2 names), Qwen2-MoE (a sigmoid-gated shared expert split like an MLP, a
dense layer), Qwen3-MoE (per-head q/k norms), OLMoE (q/k norms over all heads, clipping).
Greedy tokens identical and every logits row within 1e-5, under chunked prefill, prefix
caching and preemption (tests/distributed/tp_harness.py)."""

from __future__ import annotations

import pytest
import torch
import transformers

from pagedllm.distributed.sharding import TP_ARCHITECTURES, TPLayout
from pagedllm.model.layers.moe import MoESpec, StackedExperts
from tests.distributed.tp_harness import generate
from tests.model.family_checkpoints import MOE_FAMILIES, make_family_checkpoint

PREEMPTION = {"mixtral": "swap", "qwen2_moe": "recompute", "qwen3_moe": "swap",
              "olmoe": "recompute"}


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory, tiny_tokenizer):
    return {family: make_family_checkpoint(tmp_path_factory.mktemp(family), family,
                                           tiny_tokenizer, seed=30 + i)
            for i, family in enumerate(sorted(MOE_FAMILIES))}


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp_experts", "ep"])
@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_tp2_matches_tp1(family, expert_parallel, moe_dirs, monkeypatch):
    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "60")
    assert MOE_FAMILIES[family][1] in TP_ARCHITECTURES
    model_dir = moe_dirs[family]
    tokens1, logits1 = generate(model_dir, 1, PREEMPTION[family])
    spec = MoESpec.from_config(transformers.AutoConfig.from_pretrained(model_dir))

    def rank0_holds_its_share(engine):
        experts = next(m for m in engine.model.modules() if isinstance(m, StackedExperts))
        if expert_parallel:  # experts 0 and 1, whole
            assert (experts.first_expert, experts.num_experts) == (0, 2)
            assert experts.intermediate_size == spec.intermediate_size
        else:  # all 4, half as wide
            assert (experts.first_expert, experts.num_experts) == (0, 4)
            assert experts.intermediate_size == spec.intermediate_size // 2

    tokens2, logits2 = generate(model_dir, 2, PREEMPTION[family], check=rank0_holds_its_share,
                                enable_expert_parallel=expert_parallel)
    assert tokens2 == tokens1
    assert len(logits2) == len(logits1)
    for a, b in zip(logits1, logits2, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_expert_split_refusals(moe_dirs):
    cfg = transformers.AutoConfig.from_pretrained(moe_dirs["qwen3_moe"])  # 4 experts, width 48
    with pytest.raises(ValueError, match="must divide the model's 4 experts"):
        TPLayout.for_model(cfg, 0, 3, expert_parallel=True)
    cfg.moe_intermediate_size = 50
    with pytest.raises(ValueError, match=r"experts' width \(moe_intermediate_size 50\)"):
        TPLayout.for_model(cfg, 0, 4)
