"""A GGUF loads quantized by default: the real SmolLM2 (Q4_1 + Q8_0 embedding) keeps its
blocks, greedy tokens equal the dense `--quantization none` reference, nothing dequantized is
written to disk, and bad files fail clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFReader

from pagedllm import LLM, SamplingParams
from pagedllm.config import EngineConfig
from pagedllm.kernels import cpu_features
from pagedllm.loader import CACHE_DIR_ENV, UnsupportedModelError, load_checkpoint
from pagedllm.loader.cache import gguf_entry_dir
from pagedllm.model.layers.quant import gguf as gguf_quant
from pagedllm.model.layers.quant import prompt_tile_weights
from pagedllm.worker.model_setup import weight_bytes
from tests.model.quant.test_int8_engine import check_logprobs_close

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
]


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pagedllm-cache")


@pytest.fixture(scope="module")
def quantized_llm(smollm2_gguf: Path, private_cache: Path) -> LLM:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_DIR_ENV, str(private_cache))
        return LLM(str(smollm2_gguf), kv_cache_memory=64 * 2**20, max_model_len=512,
                   num_threads=1, int8_activations=False)


@pytest.mark.slow
def test_default_is_quantized_and_small(quantized_llm: LLM, smollm2_gguf: Path,
                                        private_cache: Path) -> None:
    model = quantized_llm.llm_engine.model
    layer = model.model.layers[0]
    assert isinstance(layer.mlp.down_proj.quant, gguf_quant.GGUFWeight)
    assert layer.mlp.down_proj.quant.format == "gguf:Q4_1"
    assert model.model.embed_tokens.quant.format == "gguf:Q8_0"
    assert model.lm_head.quant is model.model.embed_tokens.quant  # tied: one table
    file_bytes = sum(int(t.n_bytes) for t in GGUFReader(smollm2_gguf).tensors)
    resident = weight_bytes(model)
    assert resident < 150e6
    assert resident <= 1.15 * file_bytes, (resident, file_bytes)
    entry = gguf_entry_dir(smollm2_gguf, private_cache)
    assert (entry / "tokenizer.json").is_file()
    assert not (entry / "model.safetensors").exists(), "quantized path wrote a dense cache"


@pytest.mark.slow
def test_greedy_equals_dense_reference(quantized_llm: LLM, smollm2_gguf: Path,
                                       private_cache: Path) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    got = quantized_llm.generate(PROMPTS, params, use_tqdm=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_DIR_ENV, str(private_cache))
        dense = LLM(str(smollm2_gguf), kv_cache_memory=64 * 2**20, max_model_len=512,
                    num_threads=1, quantization="none")
    assert dense.llm_engine.model.lm_head.method.format.startswith("dense")
    want = dense.generate(PROMPTS, params, use_tqdm=False)
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids, g.prompt
    assert (gguf_entry_dir(smollm2_gguf, private_cache) / "model.safetensors").is_file()


@pytest.mark.slow
def test_default_path_follows_the_kernels_isa(smollm2_gguf: Path, private_cache: Path) -> None:
    """With no flag, int8 activations are on exactly where the kernels' int8 dot products are
    SIMD (kernels/cpu_features.py); elsewhere the exact path stays the default."""
    fast = cpu_features.int8_dot_isa() in cpu_features.FAST_INT8_DOT
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_DIR_ENV, str(private_cache))
        llm = LLM(str(smollm2_gguf), kv_cache_memory=16 * 2**20, max_model_len=128,
                  num_threads=1)
    assert llm.llm_engine.config.int8_activations is fast
    fmt = llm.llm_engine.model.model.layers[0].mlp.down_proj.quant.format
    assert fmt == ("gguf:Q4_1+a8" if fast else "gguf:Q4_1")


@pytest.mark.slow
def test_int8_activations_are_close_by_vllms_rule(quantized_llm: LLM, smollm2_gguf: Path,
                                                  private_cache: Path) -> None:
    """--int8-activations: the blocks stay quantized (Q4_1 / Q8_0 repacked into the integer
    kernel's panels, resident bytes = the file's), greedy outputs are close to the exact path
    by vLLM's logprob rule, and a sequence's outputs do not depend on its batch."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CACHE_DIR_ENV, str(private_cache))
        a8 = LLM(str(smollm2_gguf), kv_cache_memory=64 * 2**20, max_model_len=512,
                 num_threads=1, int8_activations=True)
    model = a8.llm_engine.model
    assert model.model.layers[0].mlp.down_proj.quant.format == "gguf:Q4_1+a8"
    assert model.lm_head.quant is model.model.embed_tokens.quant  # tied: one table
    file_bytes = sum(int(t.n_bytes) for t in GGUFReader(smollm2_gguf).tensors)
    # plus, where prompt rows run on AMX tiles, the bf16 tiles the panels may keep
    # (prompt_tile_weights.py): 2 bytes a weight of the layers, none for the tied table
    tiles = sum(m.quant.tiles.numel() * 2 for m in prompt_tile_weights.prompt_linears(model))
    assert model.lm_head.quant.tiles.numel() == 0
    assert weight_bytes(model) - tiles <= file_bytes
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=5)
    got = a8.generate(PROMPTS, params, use_tqdm=False)
    want = quantized_llm.generate(PROMPTS, params, use_tqdm=False)
    same = [check_logprobs_close(g.outputs[0], w.outputs[0])
            for g, w in zip(got, want, strict=True)]
    # prefill runs int8 activations too (llama.cpp's numerics), so the first divergence comes
    # earlier than with decode-only int8: a quarter of the tokens identical at least
    assert sum(same) >= 32, same
    alone = [a8.generate([p], params, use_tqdm=False)[0] for p in PROMPTS[:2]]
    for one, batched in zip(alone, got, strict=False):  # batch-invariant kernels
        assert one.outputs[0].token_ids == batched.outputs[0].token_ids


def test_quantization_name_is_validated() -> None:
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig(quantization="q4")


def test_not_a_gguf_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUX" + b"\0" * 200)
    with pytest.raises(UnsupportedModelError, match="not a readable GGUF file"):
        load_checkpoint(str(bad), cache_dir=tmp_path / "cache")


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.001, 0.5])
def test_truncated_gguf(smollm2_gguf: Path, tmp_path: Path, fraction: float) -> None:
    data = smollm2_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(UnsupportedModelError, match="truncated or corrupt"):
        load_checkpoint(str(cut), cache_dir=tmp_path / "cache")


def test_awq_on_a_gguf_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "m.gguf"
    bad.write_bytes(b"GGUF")
    with pytest.raises(UnsupportedModelError, match="does not apply to a GGUF"):
        load_checkpoint(str(bad), cache_dir=tmp_path / "cache", quantization="awq")


@pytest.mark.slow
def test_plan_counts_the_quantized_bytes(smollm2_gguf: Path) -> None:
    from pagedllm.memory_plan import load_config, plan

    result = plan(load_config(str(smollm2_gguf)), memory_gib=4)
    assert 60e6 < result.weight_bytes < 100e6  # not 134.5M parameters x 2 or 4 bytes
