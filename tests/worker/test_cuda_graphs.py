"""CUDA-graph bucketing (worker/cuda_graphs.py), run on CPU.

The bucket arithmetic is unit-tested; the persistent buffers, padding and replay run for
real through the engine with the Triton backend in Triton's interpreter and `EagerReplay`
standing in for graph capture (a replay re-runs the captured forward over the same
buffers), and greedy tokens must equal HF's. The same path with real graphs runs on a GPU
in tests/worker/test_cuda_greedy.py.
"""

from __future__ import annotations

import pytest
import torch

from pagedllm import SamplingParams
from pagedllm.worker import cuda_graphs
from pagedllm.worker.cuda_graphs import DecodeGraphs, EagerReplay, bucket_sizes, choose_bucket


def test_bucket_sizes():
    assert bucket_sizes(1) == [1]
    assert bucket_sizes(8) == [1, 2, 4, 8]
    assert bucket_sizes(6) == [1, 2, 4, 8]
    assert bucket_sizes(256) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert bucket_sizes(5000)[-1] == 512
    with pytest.raises(ValueError, match="max_num_seqs"):
        bucket_sizes(0)


def test_choose_bucket():
    sizes = [1, 2, 4, 8]
    assert [choose_bucket(n, sizes) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert choose_bucket(9, sizes) is None
    assert choose_bucket(0, sizes) is None


def test_graphs_off_without_the_triton_backend(monkeypatch, tiny_llama_dir, make_llm):
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "torch")
    llm = make_llm(tiny_llama_dir)
    engine = llm.llm_engine
    reason = cuda_graphs.unsupported_reason(engine.model, engine.runner.attention_backend,
                                            False)
    assert "Triton kernels are off" in reason


PROMPTS = [[5, 9, 3], [7] * 11, list(range(2, 40))]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_decode_graphs_replay_matches_hf(arch, monkeypatch, request, make_llm, hf_reference):
    """Greedy decoding through padded buckets (3 -> 4, then 2 -> 2, 1 -> 1 as requests
    finish) gives HF's tokens; prefill steps run eagerly; the padding writes no KV. Gemma 3's
    window layers keep a KV group of their own: the graphs' metadata must carry its tables
    (with group 0's alone they read and wrote the wrong blocks on the GPU)."""
    monkeypatch.setenv("PAGEDLLM_ATTENTION_BACKEND", "triton")
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    llm = make_llm(model_dir, block_size=8, max_num_seqs=4, max_model_len=64)
    engine = llm.llm_engine
    layout = engine.cache.spec.groups
    free = engine.block_manager.num_free_blocks  # (several groups keep one block back)
    assert (layout.num_groups > 1) == (arch == "gemma3")
    assert engine.runner.graphs is None  # CPU: the engine captures nothing by itself
    backend = engine.runner.attention_backend
    assert backend.name == "triton" and backend.device == torch.device("cpu")
    assert cuda_graphs.unsupported_reason(engine.model, backend, False) is None
    graphs = DecodeGraphs(engine.model, engine.cache.layer_caches, backend,
                          sizes=bucket_sizes(4), max_blocks=8, max_pos=63,
                          sliding_window=layout.groups[0].window,
                          group_windows=tuple(g.window for g in layout.groups[1:]),
                          capture=EagerReplay())
    graphs.capture(warmup=1)
    assert sorted(graphs.graphs) == [1, 2, 4]
    assert torch.count_nonzero(engine.cache.kv) == 0  # capture wrote no KV (slots -1)
    engine.runner.graphs = graphs
    lengths = [3, 6, 9]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    for prompt, n, out in zip(PROMPTS, lengths, outs, strict=True):
        expected, _ = hf_reference.greedy(model_dir, prompt, n)
        assert out.outputs[0].token_ids == expected
    assert graphs.replays == max(lengths) - 1  # every decode step, none of the prefills
    assert engine.block_manager.num_free_blocks == free  # every block back
