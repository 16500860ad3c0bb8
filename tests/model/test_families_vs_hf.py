"""The families beyond Llama / Qwen / Gemma 3 vs HF transformers on tiny random checkpoints
(fp32, CPU; tests/model/family_checkpoints.py).

Mixture of experts: Mixtral, Qwen2-MoE (shared expert, a dense layer), Qwen3-MoE and OLMoE,
each with 4 experts and top-2 routing. Dense: OLMo 2, Granite 3, SmolLM3. Greedy tokens equal
HF's for 8 prompts of 1 ... 75 tokens through `LLM.generate`, also with chunked prefill and
small blocks, with preemption and with prefix caching; logprobs within 1e-4 of HF's
log_softmax. Dense: also Gemma 2 (sliding window of 16 on one of its two layers, soft-capping).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from pagedllm import SamplingParams
from pagedllm.errors import ModelLoadError
from tests.model.family_checkpoints import FAMILIES, make_family_checkpoint
from tests.model.test_vs_hf import (
    KV_BYTES_PER_TOKEN,
    MAX_TOKENS,
    PROMPTS,
    assert_logprobs_match_hf,
    assert_matches_hf,
    assert_prefix_cached_matches_hf,
    record_schedules,
)

ALL = sorted(FAMILIES)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory, tiny_tokenizer):
    return {
        family: make_family_checkpoint(
            tmp_path_factory.mktemp(family), family, tiny_tokenizer, seed=10 + i
        )
        for i, family in enumerate(ALL)
    }


@pytest.mark.parametrize("family", ALL)
def test_greedy_batch_matches_hf(family, family_dirs, make_llm, hf_reference) -> None:
    llm = make_llm(family_dirs[family])
    steps = record_schedules(llm)
    assert_matches_hf(llm, family_dirs[family], hf_reference, PROMPTS)
    assert len(steps[0]) == len(PROMPTS)  # all prompts prefilled together in one step


@pytest.mark.parametrize("family", ALL)
def test_chunked_prefill_small_blocks(family, family_dirs, make_llm, hf_reference) -> None:
    llm = make_llm(family_dirs[family], block_size=8, max_num_batched_tokens=24)
    steps = record_schedules(llm)
    assert_matches_hf(llm, family_dirs[family], hf_reference, PROMPTS)
    assert max(sum(p.num_new_tokens for p in step) for step in steps) == 24
    assert any(
        any(p.is_prompt_chunk for p in step) and any(not p.is_prompt_chunk for p in step)
        for step in steps
    )


@pytest.mark.parametrize("family", ALL)
def test_preemption(family, family_dirs, make_llm, hf_reference) -> None:
    llm = make_llm(
        family_dirs[family],
        block_size=8,
        max_model_len=128,
        max_num_batched_tokens=16,
        kv_cache_memory=20 * 8 * KV_BYTES_PER_TOKEN,
    )
    # Gemma 2's blocks hold one layer of one KV group (sliding, full): twice the blocks.
    assert llm.llm_engine.num_blocks == (40 if family == "gemma2" else 20)
    assert_matches_hf(llm, family_dirs[family], hf_reference, PROMPTS)
    assert llm.llm_engine.stats.num_preemptions_total > 0


@pytest.mark.parametrize("family", ALL)
def test_prefix_caching(family, family_dirs, make_llm, hf_reference) -> None:
    llm = make_llm(family_dirs[family], block_size=8, max_num_batched_tokens=32)
    assert_prefix_cached_matches_hf(llm, family_dirs[family], hf_reference)


@pytest.mark.parametrize("family", ALL)
def test_logprobs_within_1e4_of_hf(family, family_dirs, make_llm, hf_reference) -> None:
    llm = make_llm(family_dirs[family], max_num_batched_tokens=16)
    assert_logprobs_match_hf(llm, family_dirs[family], hf_reference, [PROMPTS[2], PROMPTS[6]])


def test_stacked_expert_checkpoint_loads(tmp_path, family_dirs, make_llm, hf_reference) -> None:
    """A checkpoint saved in HF transformers 5's in-memory layout (`experts.gate_up_proj`
    [E, 2I, H], `experts.down_proj` [E, H, I]) loads and generates as the per-expert one."""
    import transformers
    from safetensors.torch import save_file

    source = family_dirs["qwen2_moe"]
    model = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    state = {n: t.contiguous() for n, t in model.state_dict().items()}
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, tmp_path / name)
    save_file(state, str(tmp_path / "model.safetensors"))
    llm = make_llm(tmp_path)
    prompts = PROMPTS[3:6]
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True),
        use_tqdm=False,
    )
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_reference.greedy(source, prompt, MAX_TOKENS)[0]


def test_missing_expert_weight_is_a_load_error(tmp_path, family_dirs, make_llm) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    source = family_dirs["mixtral"]
    with safe_open(str(source / "model.safetensors"), framework="pt") as f:
        state = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118
    del state["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, tmp_path / name)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"layers\.1\.mlp\.experts.*\(2, 'up'\)"):
        make_llm(tmp_path)


def test_qwen2_moe_layers_follow_the_config(family_dirs, make_llm) -> None:
    """mlp_only_layers=[1]: layer 0 is a MoE block with a gated shared expert, layer 1 a
    dense MLP of intermediate_size."""
    from pagedllm.model.layers.moe import FusedMoE

    config = json.loads((family_dirs["qwen2_moe"] / "config.json").read_text())
    assert config["mlp_only_layers"] == [1]
    layers = make_llm(family_dirs["qwen2_moe"]).llm_engine.model.model.layers
    assert isinstance(layers[0].mlp, FusedMoE) and not isinstance(layers[1].mlp, FusedMoE)
    assert layers[0].mlp.shared_expert_gate is not None
    assert layers[1].mlp.inter == config["intermediate_size"]


def test_smollm3_layers_without_rope(family_dirs, make_llm) -> None:
    layers = make_llm(family_dirs["smollm3"]).llm_engine.model.model.layers
    assert [layer.self_attn.use_rope for layer in layers] == [True, False]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(use_sliding_window=True, sliding_window=16), "use_sliding_window"),
        (dict(no_rope_layers=[1, 0, 1]), "no_rope_layers names 3 layers; the model has 2"),
        (dict(mlp_bias=True), "mlp_bias"),
    ],
)
def test_smollm3_refuses_what_it_does_not_run(
    overrides, message, tmp_path, family_dirs, make_llm
) -> None:
    source = family_dirs["smollm3"]
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, tmp_path / name)
    config = json.loads((source / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **overrides}))
    with pytest.raises(ModelLoadError, match=message):
        make_llm(tmp_path)


def test_glm4_interleaved_rope_is_rotate_half_on_reordered_rows() -> None:
    """HF GLM's interleaved rotation of a head equals Llama's rotate-half rotation of the
    head with its rows in `half_rotation_order` (partial: the last 8 of 16 features pass)."""
    from transformers.models.glm4.modeling_glm4 import apply_rotary_pos_emb

    from pagedllm.model.layers.rotary import RotaryEmbedding
    from pagedllm.model.models.glm4 import half_rotation_order

    order = half_rotation_order(16, 8)
    assert order.tolist() == [0, 2, 4, 6, 1, 3, 5, 7, *range(8, 16)]
    rotary = RotaryEmbedding(
        16, {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}, 128
    )
    positions = torch.arange(5, 40)
    cos, sin = rotary.cos_sin(positions, 39)  # [T, 1, 8] halves layout
    x = torch.randn(len(positions), 3, 16)  # [T, heads, head_dim]
    q = x.transpose(0, 1).unsqueeze(0)  # HF: [1, heads, T, d]
    want, _ = apply_rotary_pos_emb(q, q, cos.squeeze(1)[None], sin.squeeze(1)[None])
    want = want[0].transpose(0, 1)
    got = RotaryEmbedding.apply(x[..., order], cos, sin)
    torch.testing.assert_close(got, want[..., order])


def test_glm4_refuses_quantized_qk(family_dirs, make_llm) -> None:
    with pytest.raises(ModelLoadError, match="q/k rows are reordered at load"):
        make_llm(family_dirs["glm4"], quantization="int8")
