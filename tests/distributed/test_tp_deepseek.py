"""TP=2 against TP=1 for DeepSeek-V2 / V3 (tiny random checkpoints of
tests/model/deepseek_checkpoints.py: 4 heads, 8 routed experts of width 32, top-3, 2 shared
experts, a dense first layer): rank 0 holds heads 0-1 (q / q_b, kv_b rows, o_proj columns)
and the whole latent projection, caches the whole latent row (one KV "head" of
kv_lora_rank + rope), and its experts split by width or whole (expert parallelism: experts
0-3); the harness's block budget is sized for one latent row per token on each rank, so
the same NUM_BLOCKS on both shows the KV pool is the latent's. V3 (q_lora_rank, sigmoid
routing with e_score_correction_bias over groups), V2 (q_lora_rank, group_limited_greedy
softmax routing) and V2-Lite (q_proj, greedy softmax routing). Greedy tokens identical and every logits row within
1e-5, under chunked prefill, prefix caching and preemption (tests/distributed/tp_harness.py)."""

from __future__ import annotations

import pytest
import torch
import transformers

from pagedllm.distributed.sharding import TP_ARCHITECTURES, TPLayout
from pagedllm.model.layers.mla import MLAAttention
from pagedllm.model.layers.moe import FusedMoE, StackedExperts
from tests.distributed.tp_harness import generate
from tests.model.deepseek_checkpoints import make_deepseek_checkpoint

PREEMPTION = {"v3": "swap", "v2": "recompute", "v2lite": "recompute"}


@pytest.fixture(scope="module")
def deepseek_dirs(tmp_path_factory, tiny_tokenizer):
    return {variant: make_deepseek_checkpoint(tmp_path_factory.mktemp(variant), variant,
                                              tiny_tokenizer, seed=50 + i)
            for i, variant in enumerate(sorted(PREEMPTION))}


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp_experts", "ep"])
@pytest.mark.parametrize("variant", sorted(PREEMPTION))
def test_tp2_matches_tp1(variant, expert_parallel, deepseek_dirs, monkeypatch):
    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "60")
    model_dir = deepseek_dirs[variant]
    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    assert cfg.architectures[0] in TP_ARCHITECTURES
    tokens1, logits1 = generate(model_dir, 1, PREEMPTION[variant])

    def rank0_holds_its_share(engine):
        attn = next(m for m in engine.model.modules() if isinstance(m, MLAAttention))
        assert attn.num_heads == 2 and attn.kv_b_proj.weight.shape == (2 * 32, 24)
        a = attn.kv_a_proj_with_mqa
        assert (a.out_features, a.in_features) == (24 + 8, 64)
        assert attn.o_proj.in_features == 2 * 16
        moe = next(m for m in engine.model.modules() if isinstance(m, FusedMoE))
        assert moe.shared_expert.gate_up_proj.out_features == 2 * (2 * 32 // 2)
        experts = next(m for m in engine.model.modules() if isinstance(m, StackedExperts))
        if expert_parallel:
            assert (experts.first_expert, experts.num_experts) == (0, 4)
            assert experts.intermediate_size == 32
        else:
            assert (experts.first_expert, experts.num_experts) == (0, 8)
            assert experts.intermediate_size == 16

    tokens2, logits2 = generate(model_dir, 2, PREEMPTION[variant], check=rank0_holds_its_share,
                                enable_expert_parallel=expert_parallel)
    assert tokens2 == tokens1
    assert len(logits2) == len(logits1)
    for a, b in zip(logits1, logits2, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_heads_must_divide_by_the_tp_size(deepseek_dirs):
    cfg = transformers.AutoConfig.from_pretrained(deepseek_dirs["v3"])  # 4 heads
    with pytest.raises(ValueError, match="must divide the model's 4 attention heads"):
        TPLayout.for_model(cfg, 0, 3, expert_parallel=False)
    layout = TPLayout.for_model(cfg, 1, 4, expert_parallel=True)
    assert layout.max_local_kv_heads == 1 and layout.mla.head_range == (1, 2)


@pytest.mark.parametrize(("expert_parallel", "legacy_kv_b"),
                         [(False, False), (True, False), (True, True)],
                         ids=["tp_experts", "ep", "ep_one_kv_b"])
def test_tp2_on_a_quantized_deepseek2_gguf_matches_tp1(expert_parallel, legacy_kv_b, tmp_path,
                                                      tiny_tokenizer, monkeypatch):
    """A deepseek2 GGUF file (V3, Q8_0, tests/loader/gguf_deepseek2_writer.py: kv_b_proj per
    head as attn_k_b / attn_v_b, loaded as float) kept quantized: each rank cuts its heads'
    q_b rows and o_proj block columns and its experts from the file's blocks, and takes its
    heads of k_b / v_b (or, as older converters write it, rows of one attn_kv_b); widths as tests/loader/test_gguf_deepseek2.py's (kv_lora_rank and
    qk_nope 32) and doubled (dense 128, experts 64) so every split column range is whole
    32-value blocks. The same tokens, logits within the summation-order noise of
    the quantized kernels (as tests/distributed/test_tp_gguf.py)."""
    import gguf

    from pagedllm.loader.cache import CACHE_DIR_ENV
    from tests.loader.gguf_deepseek2_writer import write_deepseek2_gguf

    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "60")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    src = make_deepseek_checkpoint(tmp_path / "hf", "v3", tiny_tokenizer, seed=60,
                                   intermediate_size=128, moe_intermediate_size=64,
                                   kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16)
    path = write_deepseek2_gguf(src, tmp_path / "deepseek2-q8_0.gguf",
                                gguf.GGMLQuantizationType.Q8_0, legacy_kv_b=legacy_kv_b)

    def rank0_keeps_blocks(engine):
        attn = next(m for m in engine.model.modules() if isinstance(m, MLAAttention))
        assert attn.num_heads == 2 and attn.kv_b_proj.weight.shape == (2 * (32 + 16), 32)
        o_proj = next(m.method for m in attn.o_proj.modules() if hasattr(m, "method"))
        assert o_proj.shape == (64, 2 * 16)
        assert o_proj.format.startswith("gguf"), o_proj
        experts = next(m for m in engine.model.modules() if isinstance(m, StackedExperts))
        assert experts.quant is not None and experts.quant.format.startswith("gguf")
        assert experts.num_experts == (4 if expert_parallel else 8)

    tokens1, logits1 = generate(path, 1, "recompute", int8_activations=False)
    tokens2, logits2 = generate(path, 2, "recompute", check=rank0_keeps_blocks,
                                int8_activations=False, enable_expert_parallel=expert_parallel)
    assert tokens2 == tokens1
    for a, b in zip(logits1, logits2, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=2e-4)


def test_each_rank_cuts_its_heads_from_the_attention_weights(deepseek_dirs):
    """Rank 1 of 2 (heads 2-3): q_b rows 48-95 (24 per head), kv_b rows 64-127 (32 per
    head), GGUF's per-head k_b / v_b heads 2-3, o_proj columns 32-63 (16 per head) and its
    bias only on rank 0; the latent projections and their norms whole."""
    cfg = transformers.AutoConfig.from_pretrained(deepseek_dirs["v3"])
    layout = TPLayout.for_model(cfg, 1, 2, expert_parallel=True)
    attn = "model.layers.1.self_attn."
    q_b = torch.arange(4 * 24 * 32.0).view(4 * 24, 32)
    torch.testing.assert_close(layout.shard(attn + "q_b_proj.weight", q_b), q_b[48:])
    kv_b = torch.randn(4 * 32, 24)
    torch.testing.assert_close(layout.shard(attn + "kv_b_proj.weight", kv_b), kv_b[64:])
    k_b = torch.randn(4, 24, 16)
    torch.testing.assert_close(layout.shard(attn + "k_b_proj.weight", k_b), k_b[2:])
    o = torch.randn(64, 4 * 16)
    torch.testing.assert_close(layout.shard(attn + "o_proj.weight", o), o[:, 32:])
    assert not layout.shard(attn + "o_proj.bias", torch.ones(64)).any()
    for name, shape in (("q_a_proj.weight", (32, 64)), ("kv_a_proj_with_mqa.weight", (32, 64)),
                        ("kv_a_layernorm.weight", (24,)), ("q_a_layernorm.weight", (32,))):
        t = torch.randn(shape)
        assert layout.shard(attn + name, t) is t, name
    shared = torch.randn(64, 64)  # 2 shared experts of width 32: one MLP of width 64
    torch.testing.assert_close(
        layout.shard("model.layers.1.mlp.shared_experts.gate_proj.weight", shared), shared[32:])
