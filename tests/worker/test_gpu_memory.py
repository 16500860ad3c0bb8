"""GPU memory planning arithmetic (worker/gpu_memory.py) with injected numbers, the
profiling batch's shape, and bf16 as the CUDA default dtype; the profiling pass itself runs
on a GPU in tests/worker/test_cuda_greedy.py."""

from __future__ import annotations

import pytest
import torch

from pagedllm.config import KVCacheSpec, resolve_dtype
from pagedllm.worker.gpu_memory import GiB, GpuMemoryPlan, profile_requests
from pagedllm.worker.model_setup import plan_num_blocks


def test_kv_budget_is_utilization_share_minus_weights_peak_and_outside_torch():
    plan = GpuMemoryPlan(total=140 * GiB, utilization=0.9, weights=int(0.25 * GiB),
                         activation_peak=int(1.5 * GiB), non_torch=int(0.5 * GiB),
                         profiled_tokens=2048)
    assert plan.usable == int(126 * GiB)
    assert plan.kv_budget == int(126 * GiB) - int(2.25 * GiB)
    spec = KVCacheSpec(num_layers=30, num_kv_heads=3, head_dim=64, dtype=torch.bfloat16,
                       block_size=16)
    blocks = plan_num_blocks(spec, plan.kv_budget, 8192)
    assert blocks == plan.kv_budget // (16 * 2 * 30 * 3 * 64 * 2)
    text = "\n".join(plan.lines())
    assert "activation peak" in text and "profiled at 2048 tokens" in text
    assert "126.00 GiB" in text


def test_no_room_for_the_kv_cache_is_a_precise_error():
    plan = GpuMemoryPlan(total=8 * GiB, utilization=0.5, weights=3 * GiB,
                         activation_peak=2 * GiB)
    with pytest.raises(ValueError, match="no GPU memory left for the KV cache.*4.00 GiB"):
        _ = plan.kv_budget
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        GpuMemoryPlan(total=GiB, utilization=1.5, weights=0, activation_peak=0)


@pytest.mark.parametrize("tokens,seqs,max_len,expect", [
    (2048, 256, 8192, 256),   # spread over max_num_seqs prompts of 8 tokens
    (2048, 1, 8192, 1),       # one prompt of 2048
    (2048, 1, 512, 4),        # no prompt longer than max_model_len
    (10, 256, 8192, 10),      # at most one prompt per token
])
def test_profile_batch(tokens, seqs, max_len, expect):
    scheduled, blocks = profile_requests(tokens, seqs, max_len, 16)
    assert len(scheduled) == expect
    assert sum(s.num_new_tokens for s in scheduled) == tokens
    assert max(s.num_new_tokens for s in scheduled) <= max_len
    ids = [b for s in scheduled for b in s.request.block_ids]
    assert ids == list(range(blocks))  # each prompt its own blocks of the scratch cache
    assert all(len(s.request.block_ids) * 16 >= s.num_new_tokens for s in scheduled)


def test_bf16_is_the_default_on_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_dtype("auto", torch.device("cuda")) == torch.float16
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32


class FakeCudaMemory:
    """torch.cuda's memory counters for `profile` on CPU: fixed totals, and a peak that the
    profiling step "raises" by a known amount once the scratch cache exists."""

    def __init__(self) -> None:
        self.allocated = 300 * 2**20
        self.peak = self.allocated

    def install(self, monkeypatch) -> None:
        for name in ("synchronize", "empty_cache"):
            monkeypatch.setattr(torch.cuda, name, lambda *a, **k: None)
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: self.allocated)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: self.peak)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 1 * GiB)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (20 * GiB, 24 * GiB))

    def reset(self, *a) -> None:
        self.peak = self.allocated + 200 * 2**20


def test_profile_runs_the_real_model_and_sampler(monkeypatch, tiny_llama_dir, make_llm):
    """The profiling step itself (dummy prompts at max_num_batched_tokens through the model,
    logits and the sampler) on CPU, with torch.cuda's counters faked."""
    from pagedllm.worker import gpu_memory

    llm = make_llm(tiny_llama_dir, max_num_batched_tokens=64, max_num_seqs=4)
    engine = llm.llm_engine
    fake = FakeCudaMemory()
    fake.install(monkeypatch)
    plan = gpu_memory.profile(engine.model, engine.kv_spec, engine.config, engine.vocab_size,
                              engine.runner.attention_backend)
    assert plan.weights == 300 * 2**20 and plan.activation_peak == 200 * 2**20
    assert plan.non_torch == 3 * GiB  # 24 - 20 GiB in use, 1 GiB of it torch's
    assert plan.total == 24 * GiB and plan.profiled_tokens == 64
