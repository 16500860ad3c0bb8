"""MoE GGUF files: qwen2moe, qwen3moe and Mixtral (written as `llama`) by
tests/loader/gguf_writer.py (experts stacked per layer, Q8_0 matrices, F32 routers), loaded by
pagedllm with every expert's matrix kept in Q8_0 blocks, or dequantized: greedy tokens equal HF
transformers on the source checkpoint whose quantized tensors hold their Q8_0 round trip (HF's
own GGUF loader reads neither the experts' width, nor llama.cpp's top-k renormalization of
qwen3moe, nor Mixtral files)."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedllm.loader.cache import CACHE_DIR_ENV
from pagedllm.model.layers.moe import FusedMoE, StackedExperts
from tests.loader.gguf_writer import write_gguf
from tests.model.family_checkpoints import make_family_checkpoint
from tests.model.test_vs_hf import PROMPTS, assert_matches_hf

Q8_0 = gguf.GGMLQuantizationType.Q8_0
# GGUF arch -> (tiny family, overrides: what llama.cpp's format implies, and widths that are
# multiples of Q8_0's 32-value blocks)
ARCHES = {
    "qwen2moe": (
        "qwen2_moe",
        dict(
            mlp_only_layers=[],
            norm_topk_prob=False,
            moe_intermediate_size=64,
            shared_expert_intermediate_size=96,
        ),
    ),
    "qwen3moe": ("qwen3_moe", dict(norm_topk_prob=True, moe_intermediate_size=64)),
    "llama": ("mixtral", dict(intermediate_size=64)),
}
MODEL_CLASS = {
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "llama": "MixtralForCausalLM",
}


def _round_trip(name: str, t: torch.Tensor) -> torch.Tensor:
    """What the writer's Q8_0 blocks hold for a tensor (routers and vectors stay F32)."""
    if t.dim() < 2 or name.endswith(
        ("mlp.gate.weight", "shared_expert_gate.weight", "block_sparse_moe.gate.weight")
    ):
        return t
    a = t.float().numpy()
    return torch.from_numpy(
        gguf.quants.dequantize(gguf.quants.quantize(a, Q8_0), Q8_0)
        .reshape(a.shape)
        .astype(np.float32)
    )


@pytest.fixture(scope="module", params=sorted(ARCHES))
def moe_gguf(request, tmp_path_factory, tiny_tokenizer):
    arch = request.param
    family, overrides = ARCHES[arch]
    root = tmp_path_factory.mktemp(arch)
    src = make_family_checkpoint(root / "hf", family, tiny_tokenizer, seed=40, **overrides)
    path = write_gguf(src, root / f"{arch}-q8_0.gguf", arch, Q8_0)
    ref = root / "reference"
    ref.mkdir()
    for f in src.iterdir():
        shutil.copy(f, ref / f.name)
    tensors = load_file(str(src / "model.safetensors"))
    save_file({n: _round_trip(n, t) for n, t in tensors.items()}, str(ref / "model.safetensors"))
    return arch, path, ref


@pytest.mark.parametrize("quantization", [None, "none"])
def test_moe_gguf_matches_hf(
    moe_gguf, quantization, tmp_path, monkeypatch, make_llm, hf_reference
) -> None:
    arch, path, ref = moe_gguf
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    llm = make_llm(path, quantization=quantization, int8_activations=False, max_model_len=512)
    model = llm.llm_engine.model
    assert type(model).__name__ == MODEL_CLASS[arch]
    blocks = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert len(blocks) == 2 and blocks[0].router.renormalize == (arch != "qwen2moe")
    assert (blocks[0].shared_expert is not None) == (arch == "qwen2moe")
    experts = [m for m in model.modules() if isinstance(m, StackedExperts)]
    if quantization is None:  # kept in the file's blocks, one weight per expert
        assert all(m.quant is not None and m.quant.format.startswith("gguf") for m in experts)
    else:
        assert all(m.quant is None for m in experts)
    assert_matches_hf(llm, ref, hf_reference, PROMPTS)


def test_plan_counts_the_files_expert_blocks(moe_gguf) -> None:
    """`pagedllm plan` on the GGUF file: the experts' bytes are their Q8_0 blocks (34 bytes
    per 32 values), not their parameters in a float dtype."""
    from pagedllm.memory_plan import load_config, plan

    _, path, _ = moe_gguf
    cfg = load_config(str(path))
    result = plan(cfg, kv_cache_memory_gib=1)
    per_matrix = 64 * (64 // 32) * 34  # [64, 64] in Q8_0
    assert result.expert_bytes == 2 * 4 * 3 * per_matrix  # layers x experts x gate/up/down
    assert result.weight_bytes == cfg.weight_bytes > result.expert_bytes
    assert "4 experts of width 64, top-2" in "\n".join(result.lines())
