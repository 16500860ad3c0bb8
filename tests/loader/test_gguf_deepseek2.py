"""`deepseek2` GGUF files (DeepSeek-V3, V2, V2-Lite style) written by
tests/loader/gguf_deepseek2_writer.py as llama.cpp's converter lays them out, loaded by pagedllm
with every matrix (the experts' included) kept in its Q8_0 blocks, or dequantized: greedy
tokens equal HF transformers on the source checkpoint whose quantized tensors hold their Q8_0
round trip (HF's own GGUF loader does not read deepseek2).

    v3      Q8_0, kv_b split into attn_k_b / attn_v_b (current converters), sigmoid gating,
            grouped top-k, exp_probs_b
    v2      Q8_0, one attn_kv_b and MHA head sizes (older converters), group_limited_greedy
    v2lite  F32, no q_lora_rank (attn_q), plain top-k
"""

from __future__ import annotations

import shutil

import gguf
import pytest
from safetensors.torch import save_file

from pagedllm.loader.cache import CACHE_DIR_ENV
from pagedllm.model.layers.moe import FusedMoE, StackedExperts
from tests.loader.gguf_deepseek2_writer import file_values, write_deepseek2_gguf
from tests.model.deepseek_checkpoints import make_deepseek_checkpoint
from tests.model.test_vs_hf import PROMPTS, assert_matches_hf

Q8_0, F32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
# Widths that are multiples of Q8_0's 32-value blocks (k_b's rows are qk_nope_head_dim long).
DIMS = dict(kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16)
FILES = {"v3": (Q8_0, False), "v2": (Q8_0, True), "v2lite": (F32, False)}
ROUTING = {"v3": (4, "sigmoid", True, "top2"), "v2": (4, "softmax", False, "max"),
           "v2lite": (1, "softmax", False, "max")}


@pytest.fixture(scope="module", params=sorted(FILES))
def ds_gguf(request, tmp_path_factory, tiny_tokenizer):
    variant = request.param
    qtype, legacy = FILES[variant]
    root = tmp_path_factory.mktemp(f"gguf-{variant}")
    src = make_deepseek_checkpoint(root / "hf", variant, tiny_tokenizer, seed=7, **DIMS)
    path = write_deepseek2_gguf(src, root / f"{variant}.gguf", qtype, legacy_kv_b=legacy)
    ref = root / "reference"
    ref.mkdir()
    for f in src.iterdir():
        shutil.copy(f, ref / f.name)
    save_file(file_values(src, qtype, legacy), str(ref / "model.safetensors"))
    return variant, path, ref, src


@pytest.mark.parametrize("quantization", [None, "none"])
def test_deepseek2_gguf_matches_hf(ds_gguf, quantization, tmp_path, monkeypatch, make_llm,
                                   hf_reference) -> None:
    variant, path, ref, _ = ds_gguf
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    llm = make_llm(path, quantization=quantization, int8_activations=False, max_model_len=512)
    model = llm.llm_engine.model
    assert model.config.architectures == [
        "DeepseekV3ForCausalLM" if variant == "v3" else "DeepseekV2ForCausalLM"]
    blocks = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert len(blocks) == 2  # layer 0 dense (leading_dense_block_count)
    groups, scoring, bias, group_score = ROUTING[variant]
    router = blocks[0].router
    assert (router.num_groups, router.scoring, router.group_score) == (groups, scoring,
                                                                        group_score)
    assert (blocks[0].expert_bias is not None) == bias and router.scale == 2.5
    experts = [m for m in model.modules() if isinstance(m, StackedExperts)]
    if quantization is None and FILES[variant][0] == Q8_0:  # kept in the file's blocks
        assert all(m.quant is not None and m.quant.format.startswith("gguf") for m in experts)
        assert model.model.layers[1].self_attn.o_proj.quant is not None
    else:
        assert all(m.quant is None for m in experts)
    assert llm.llm_engine.cache.spec.head_dim == 32 + 16  # the latent row
    assert_matches_hf(llm, ref, hf_reference, PROMPTS)


def test_config_from_metadata(ds_gguf) -> None:
    """The HF config pagedllm derives from the file's metadata has the source's shape."""
    from pagedllm.loader.gguf_loader import gguf_config, open_gguf
    from pagedllm.model.layers.mla import softmax_scale

    variant, path, _, src = ds_gguf
    import transformers

    want = transformers.AutoConfig.from_pretrained(src)
    got = gguf_config(open_gguf(path, vocabulary=False))
    assert got.model_type == want.model_type
    for key in ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                "num_attention_heads", "n_routed_experts", "num_experts_per_tok",
                "n_shared_experts", "routed_scaling_factor", "first_k_dense_replace",
                "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                "v_head_dim", "max_position_embeddings", "tie_word_embeddings"):
        assert getattr(got, key) == getattr(want, key), key
    if variant != "v2lite":
        assert (got.n_group, got.topk_group) == (want.n_group, want.topk_group)
    assert softmax_scale(got) == pytest.approx(softmax_scale(want), rel=1e-6)  # yarn mscale


def test_plan_reads_the_latent_cache(ds_gguf) -> None:
    from pagedllm.memory_plan import load_config, plan

    _, path, _, _ = ds_gguf
    result = plan(load_config(str(path)), kv_cache_memory_gib=1, kv_dtype_bytes=4)
    assert result.kv_bytes_per_token == 3 * (32 + 16) * 4
    assert "of latent KV" in "\n".join(result.lines())
