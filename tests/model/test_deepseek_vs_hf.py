"""DeepSeek-V2 / V3 (multi-head latent attention + their MoE) vs HF transformers on tiny
random checkpoints (fp32, CPU; tests/model/deepseek_checkpoints.py): V3 (q_lora_rank,
sigmoid router with expert bias, grouped top-k), V2 (group_limited_greedy) and V2-Lite style
(no q_lora_rank), all with YaRN + mscale, shared experts and a dense first layer.

Greedy tokens equal HF's for 8 prompts of 1 ... 75 tokens through `LLM.generate`, also with
chunked prefill and small blocks, with preemption and with prefix caching; logprobs within
1e-4 of HF's log_softmax. The KV pool is the latent cache: one part of kv_lora_rank +
qk_rope_head_dim values per token per layer.
"""

from __future__ import annotations

import pytest

from pagedllm import SamplingParams
from tests.model.deepseek_checkpoints import LATENT_BYTES, VARIANTS, make_deepseek_checkpoint
from tests.model.test_vs_hf import (
    PROMPTS,
    assert_logprobs_match_hf,
    assert_matches_hf,
    assert_prefix_cached_matches_hf,
    record_schedules,
)

ALL = sorted(VARIANTS)


@pytest.fixture(scope="module")
def ds_dirs(tmp_path_factory, tiny_tokenizer):
    return {v: make_deepseek_checkpoint(tmp_path_factory.mktemp(v), v, tiny_tokenizer, seed=i)
            for i, v in enumerate(ALL)}


@pytest.mark.parametrize("variant", ALL)
def test_greedy_batch_matches_hf(variant, ds_dirs, make_llm, hf_reference) -> None:
    llm = make_llm(ds_dirs[variant])
    steps = record_schedules(llm)
    assert_matches_hf(llm, ds_dirs[variant], hf_reference, PROMPTS)
    assert len(steps[0]) == len(PROMPTS)


@pytest.mark.parametrize("variant", ALL)
def test_chunked_prefill_small_blocks(variant, ds_dirs, make_llm, hf_reference) -> None:
    llm = make_llm(ds_dirs[variant], block_size=8, max_num_batched_tokens=24)
    steps = record_schedules(llm)
    assert_matches_hf(llm, ds_dirs[variant], hf_reference, PROMPTS)
    assert any(
        any(p.is_prompt_chunk for p in step) and any(not p.is_prompt_chunk for p in step)
        for step in steps)


@pytest.mark.parametrize("variant", ALL)
def test_preemption(variant, ds_dirs, make_llm, hf_reference) -> None:
    llm = make_llm(ds_dirs[variant], block_size=8, max_model_len=128,
                   max_num_batched_tokens=16, kv_cache_memory=20 * 8 * LATENT_BYTES)
    assert llm.llm_engine.num_blocks == 20  # latent bytes per token size the pool
    assert_matches_hf(llm, ds_dirs[variant], hf_reference, PROMPTS)
    assert llm.llm_engine.stats.num_preemptions_total > 0


def test_swap_preemption(ds_dirs, make_llm, hf_reference) -> None:
    """Preempted sequences' latent blocks go to CPU swap space and come back."""
    llm = make_llm(ds_dirs["v3"], block_size=8, max_model_len=128, max_num_batched_tokens=16,
                   kv_cache_memory=20 * 8 * LATENT_BYTES, preemption_mode="swap",
                   swap_space=256 * 8 * LATENT_BYTES / 2**30)
    assert_matches_hf(llm, ds_dirs["v3"], hf_reference, PROMPTS)
    engine = llm.llm_engine
    assert engine.cache.swap_pools[0].shape[1] == 1  # one latent part, as the device pool
    assert engine.scheduler.num_swap_outs > 0
    assert engine.stats.swapped_in_blocks_total == engine.stats.swapped_out_blocks_total > 0


@pytest.mark.parametrize("variant", ALL)
def test_prefix_caching(variant, ds_dirs, make_llm, hf_reference) -> None:
    llm = make_llm(ds_dirs[variant], block_size=8, max_num_batched_tokens=32)
    assert_prefix_cached_matches_hf(llm, ds_dirs[variant], hf_reference)


@pytest.mark.parametrize("variant", ALL)
def test_logprobs_within_1e4_of_hf(variant, ds_dirs, make_llm, hf_reference) -> None:
    llm = make_llm(ds_dirs[variant], max_num_batched_tokens=16)
    assert_logprobs_match_hf(llm, ds_dirs[variant], hf_reference, [PROMPTS[2], PROMPTS[7]])


def test_latent_cache_layout(ds_dirs, make_llm) -> None:
    """One pool part of kv_lora_rank + qk_rope_head_dim per layer; V is K's pool."""
    llm = make_llm(ds_dirs["v3"])
    engine = llm.llm_engine
    spec = engine.cache.spec
    assert (spec.parts, spec.num_kv_heads, spec.head_dim) == (1, 1, 24 + 8)
    assert spec.bytes_per_token == LATENT_BYTES
    cache = engine.cache.layer_caches[0]
    assert cache.k.data_ptr() == cache.v.data_ptr()


def test_layers_and_routing_follow_the_config(ds_dirs, make_llm) -> None:
    from pagedllm.model.layers.moe import FusedMoE
    from pagedllm.model.models.llama import LlamaMLP

    for variant, groups, scoring, bias in (("v3", 4, "sigmoid", True),
                                           ("v2", 4, "softmax", False),
                                           ("v2lite", 1, "softmax", False)):
        model = make_llm(ds_dirs[variant]).llm_engine.model
        layers = model.model.layers
        assert isinstance(layers[0].mlp, LlamaMLP)
        moe = layers[1].mlp
        assert isinstance(moe, FusedMoE) and isinstance(layers[2].mlp, FusedMoE)
        assert (moe.router.num_groups, moe.router.scoring) == (groups, scoring)
        assert (moe.expert_bias is not None) == bias
        assert moe.router.scale == 2.5 and moe.shared_expert is not None


def test_softmax_scale_matches_hf(ds_dirs) -> None:
    """YaRN with mscale_all_dim: HF's scaling (qk_head_dim^-0.5 x mscale^2), not 1/sqrt(d)."""
    import transformers

    from pagedllm.model.layers.mla import softmax_scale

    for variant in ("v3", "v2"):
        model = transformers.AutoModelForCausalLM.from_pretrained(ds_dirs[variant])
        expected = model.model.layers[0].self_attn.scaling
        assert softmax_scale(model.config) == pytest.approx(expected, rel=1e-12)
        assert expected != pytest.approx(24 ** -0.5)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_every_attention_backend_runs_the_latent_cache(backend, ds_dirs, monkeypatch, make_llm,
                                                       hf_reference) -> None:
    """K and V are views of the one latent pool, so the torch reference and the Triton
    kernels (in Triton's interpreter here) run MLA as they run MQA; the C++ kernels run the
    tests above."""
    from pagedllm.model.layers.attention_backends.cpu import CPUBackend

    if backend == "torch":  # the C++ kernels step aside, as on a CPU without them
        monkeypatch.setattr(CPUBackend, "supports", classmethod(lambda cls, *args: False))
    else:
        monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", backend)
    llm = make_llm(ds_dirs["v3"], block_size=8, max_num_batched_tokens=16)
    assert llm.llm_engine.runner.attention_backend.name == backend
    prompts = [[3, 8, 1, 9], list(range(2, 23))]  # the second: a chunk after cached context
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_reference.greedy(ds_dirs["v3"], prompt, 4)[0]


def test_int8_kv_cache_is_refused(ds_dirs, make_llm) -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype 'int8' is not supported with "
                                         "deepseek_v3's latent KV cache"):
        make_llm(ds_dirs["v3"], kv_cache_dtype="int8")


def test_v3_without_interleaved_rope(tmp_path, tiny_tokenizer, make_llm, hf_reference) -> None:
    """`rope_interleave: false` (rotate-half over the rope dims) equals HF too."""
    model_dir = make_deepseek_checkpoint(tmp_path, "v3", tiny_tokenizer, seed=5,
                                         rope_interleave=False)
    llm = make_llm(model_dir, block_size=8, max_num_batched_tokens=24)
    assert not llm.llm_engine.model.model.layers[0].self_attn.interleaved
    assert_matches_hf(llm, model_dir, hf_reference, PROMPTS)
