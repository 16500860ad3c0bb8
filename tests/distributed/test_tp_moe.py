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

from pagedllm.distributed.expert_sharding import ExpertSplit
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


def test_expert_parallel_by_default_when_the_ranks_divide_the_experts(moe_dirs):
    """benchmarks/moe_parallel.py measured whole experts per rank faster than split experts
    (docs/distributed.md), so that is the default where N divides E."""
    cfg = transformers.AutoConfig.from_pretrained(moe_dirs["qwen3_moe"])  # 4 experts, width 48
    assert TPLayout.for_model(cfg, 1, 2).experts.expert_range == (2, 4)
    assert ExpertSplit.for_model(cfg, 0, 3, None).expert_parallel is False
    assert ExpertSplit.for_model(cfg, 0, 2, False).expert_range == (0, 4)
    dense = transformers.AutoConfig.from_pretrained(moe_dirs["qwen3_moe"])
    dense.model_type = "qwen3"
    assert ExpertSplit.for_model(dense, 0, 2, None) is None


def test_expert_split_refusals(moe_dirs):
    cfg = transformers.AutoConfig.from_pretrained(moe_dirs["qwen3_moe"])  # 4 experts, width 48
    with pytest.raises(ValueError, match="must divide the model's 4 experts"):
        TPLayout.for_model(cfg, 0, 3, expert_parallel=True)
    cfg.moe_intermediate_size = 50
    with pytest.raises(ValueError, match=r"experts' width \(moe_intermediate_size 50\)"):
        TPLayout.for_model(cfg, 0, 4, expert_parallel=False)


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp_experts", "ep"])
def test_tp2_on_a_quantized_moe_gguf_matches_tp1(expert_parallel, tmp_path, tiny_tokenizer,
                                                  monkeypatch):
    """A qwen3moe GGUF file (Q8_0 experts, tests/loader/gguf_writer.py) kept quantized: each
    rank cuts its experts from the file's blocks (half of every expert's 64 rows / columns:
    whole 32-value blocks), or holds its two experts whole; the same tokens, logits within
    the summation-order noise of the quantized kernels (as tests/distributed/test_tp_gguf.py)."""
    import gguf

    from pagedllm.loader.cache import CACHE_DIR_ENV
    from tests.loader.gguf_writer import write_gguf

    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "60")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    src = make_family_checkpoint(tmp_path / "hf", "qwen3_moe", tiny_tokenizer, seed=40,
                                 norm_topk_prob=True, moe_intermediate_size=64)
    path = write_gguf(src, tmp_path / "qwen3moe-q8_0.gguf", "qwen3moe",
                      gguf.GGMLQuantizationType.Q8_0)

    def rank0_keeps_blocks(engine):
        experts = next(m for m in engine.model.modules() if isinstance(m, StackedExperts))
        assert experts.quant is not None and experts.quant.format.startswith("gguf")
        assert experts.num_experts == (2 if expert_parallel else 4)
        assert experts.quant.down[0].shape == ((64, 64) if expert_parallel else (64, 32))

    tokens1, logits1 = generate(path, 1, "recompute", int8_activations=False)
    tokens2, logits2 = generate(path, 2, "recompute", check=rank0_keeps_blocks,
                                int8_activations=False, enable_expert_parallel=expert_parallel)
    assert tokens2 == tokens1
    for a, b in zip(logits1, logits2, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=2e-4)
