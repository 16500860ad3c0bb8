"""Qwen sliding windows as HF transformers 5 applies them (`use_sliding_window`).

Qwen2-MoE: the layers `layer_types` marks sliding (by default the even layers below
`max_window_layers`) see the last `sliding_window` keys, the others all keys. A tiny 4-layer
model, window 16 on layers 0 and 2 (`max_window_layers` 3), against HF on prompts up to 75
tokens + 32 generated: equal greedy tokens, with per-layer KV groups (sliding layers free
out-of-window blocks) and with one table for all layers (`disable_hybrid_kv_cache_manager`),
its decode steps in the C++ layer loop (each layer's window within its group's).

Qwen2 dense: HF slides the layers from `max_window_layers` on; pagedllm's Llama attention
applies one window to all layers or none, so all-sliding and none-sliding configs equal HF
and a config sliding some layers only is refused with a clear error."""

from __future__ import annotations

import pytest

from pagedllm.errors import ModelLoadError
from pagedllm.model.fused_decode import FusedDecode
from pagedllm.model.models.moe import qwen2_moe_windows
from tests.conftest import make_tiny_checkpoint
from tests.model.family_checkpoints import make_family_checkpoint
from tests.model.test_vs_hf import PROMPTS, assert_matches_hf

WINDOW = 16


@pytest.fixture(scope="module")
def sliding_dir(tmp_path_factory, tiny_tokenizer):
    return make_family_checkpoint(
        tmp_path_factory.mktemp("qwen2_moe_sliding"), "qwen2_moe", tiny_tokenizer, seed=5,
        num_hidden_layers=4, mlp_only_layers=[1], use_sliding_window=True,
        sliding_window=WINDOW, max_window_layers=3)


def test_windows_follow_hf_layer_types(sliding_dir) -> None:
    import transformers

    config = transformers.AutoConfig.from_pretrained(sliding_dir)
    assert config.layer_types == ["sliding_attention", "full_attention"] * 2
    assert qwen2_moe_windows(config) == [WINDOW, None, WINDOW, None]
    config.use_sliding_window = False
    assert qwen2_moe_windows(config) == [None] * 4


@pytest.mark.parametrize("one_table", [False, True])
def test_sliding_qwen2_moe_matches_hf(one_table, sliding_dir, make_llm, hf_reference) -> None:
    assert max(len(p) for p in PROMPTS) > WINDOW
    llm = make_llm(sliding_dir, max_model_len=512, disable_hybrid_kv_cache_manager=one_table)
    model = llm.llm_engine.model
    assert [layer.self_attn.window for layer in model.model.layers] == [WINDOW, None] * 2
    groups = llm.llm_engine.kv_spec.groups.groups
    if one_table:
        assert len(groups) == 1 and groups[0].window is None
    else:
        assert sorted((g.window or 0, g.layers) for g in groups) == [(0, (1, 3)), (WINDOW, (0, 2))]
    assert_matches_hf(llm, sliding_dir, hf_reference, PROMPTS)
    assert isinstance(model.model.fused_decode(), FusedDecode)  # the decodes took the loop


@pytest.mark.parametrize(("max_window_layers", "windows"), [(0, [WINDOW] * 2), (2, [None] * 2)])
def test_qwen2_dense_window_layers_match_hf(max_window_layers, windows, tmp_path, tiny_tokenizer,
                                            make_llm, hf_reference) -> None:
    model_dir = make_tiny_checkpoint(tmp_path / "qwen2", "qwen2", tiny_tokenizer, seed=2,
                                     use_sliding_window=True, sliding_window=WINDOW,
                                     max_window_layers=max_window_layers)
    llm = make_llm(model_dir, max_model_len=512)
    assert [g.window for g in llm.llm_engine.kv_spec.groups.groups] == windows[:1]
    assert_matches_hf(llm, model_dir, hf_reference, PROMPTS)


def test_qwen2_dense_with_some_sliding_layers_is_refused(tmp_path, tiny_tokenizer,
                                                         make_llm) -> None:
    model_dir = make_tiny_checkpoint(tmp_path / "qwen2", "qwen2", tiny_tokenizer,
                                     use_sliding_window=True, sliding_window=WINDOW,
                                     max_window_layers=1)
    with pytest.raises(ModelLoadError, match=r"\(use_sliding_window\) on layers \[1\] only \(of 2"):
        make_llm(model_dir, max_model_len=512)
