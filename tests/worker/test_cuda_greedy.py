"""On a GPU only: greedy tokens of tiny random Llama / Qwen2 / Gemma 3 equal HF
transformers' on the same GPU, with CUDA graphs (the default) and with --enforce-eager.

Runs in fp32 on both sides (bf16 rounding differs between any two implementations, so
exact token equality is an fp32 claim); the kernels are the compiled Triton ones. Skipped
where torch sees no CUDA device; scripts/gpu_check.sh runs it on a lent GPU.
"""

from __future__ import annotations

import pytest
import torch

from pagedllm import SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPTS = [[5, 9, 3], [7] * 17, list(range(2, 60)), [11, 4] * 20]
MAX_TOKENS = 12


_HF: dict = {}


@torch.inference_mode()
def hf_greedy_cuda(model_dir, prompt: list[int], n: int) -> list[int]:
    """HF's argmax at each step over the whole sequence (no EOS handling: the engine runs
    with ignore_eos, so an EOS argmax is a token like any other on both sides). HF's eager
    attention: on an H200 (transformers 5.17) its SDPA path gave tiny Gemma 3 (window 16)
    other tokens after a near tie than its own eager path and HF on the CPU, which agree with
    each other and with the engine (graphs, eager, torch backend, CPU)."""
    import transformers

    key = str(model_dir)
    if key not in _HF:
        _HF[key] = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="eager").cuda().eval()
    ids = torch.tensor([prompt], device="cuda")
    for _ in range(n):
        nxt = _HF[key](ids).logits[0, -1].argmax()
        ids = torch.cat([ids, nxt.view(1, 1)], 1)
    return ids[0, len(prompt):].tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("enforce_eager", [False, True])
def test_greedy_matches_hf_on_gpu(arch, enforce_eager, request, make_llm):
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    llm = make_llm(model_dir, device="cuda", dtype="float32", enforce_eager=enforce_eager,
                   max_num_seqs=8, kv_cache_memory=64 * 2**20)
    graphs = llm.llm_engine.runner.graphs
    assert (graphs is None) == enforce_eager
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy_cuda(model_dir, prompt, MAX_TOKENS)
    if graphs is not None:
        assert graphs.replays >= MAX_TOKENS - 1


def test_bf16_is_the_cuda_default_and_memory_is_profiled(tiny_llama_dir, make_llm, caplog):
    caplog.set_level("INFO")
    llm = make_llm(tiny_llama_dir, device="cuda", kv_cache_memory=None,
                   gpu_memory_utilization=0.2)
    engine = llm.llm_engine
    assert engine.config.torch_dtype == torch.bfloat16
    assert engine.cache.kv.dtype == torch.bfloat16
    assert "activation peak" in caplog.text and "KV budget" in caplog.text
    out = llm.generate([{"prompt_token_ids": PROMPTS[1]}],
                       SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) >= 1
