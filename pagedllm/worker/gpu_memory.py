"""GPU memory planning: what the KV pool may take after weights and the activation peak.

    usable     = total device memory x gpu_memory_utilization
    KV budget  = usable - weights - activation peak - memory outside torch (CUDA context)
    KV blocks  = KV budget // bytes per block                (model_setup.plan_num_blocks)

The activation peak is measured, not estimated: a profiling step runs the forward pass at
`max_num_batched_tokens` (split over up to `max_num_seqs` prompts, as vLLM does) on a
scratch KV cache, then computes logits and samples (top-k / top-p / logprobs, the sampler's
largest temporaries) for every one of those prompts. `torch.cuda.max_memory_allocated`
minus what was allocated before the step is the peak; the scratch cache is freed before the
real pool is allocated. CUDA graphs are captured later from the share left outside the
utilization (their pool is small: activations of at most max_num_seqs decode tokens).
`GpuMemoryPlan` is plain arithmetic, testable with injected numbers on any machine.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from pagedllm.config import EngineConfig, KVCacheSpec
from pagedllm.core.request import Request
from pagedllm.core.scheduler_output import ScheduledRequest
from pagedllm.model.layers.attention_backends import PagedAttentionBackend
from pagedllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
GiB = 2**30


@dataclass
class GpuMemoryPlan:
    total: int
    utilization: float
    weights: int
    activation_peak: int
    non_torch: int = 0
    profiled_tokens: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.utilization}")
        if min(self.total, self.weights, self.activation_peak, self.non_torch) < 0:
            raise ValueError("memory sizes must be >= 0")

    @property
    def usable(self) -> int:
        return int(self.total * self.utilization)

    @property
    def kv_budget(self) -> int:
        """Bytes left for the KV pool; ValueError when nothing is left."""
        budget = self.usable - self.weights - self.activation_peak - self.non_torch
        if budget <= 0:
            raise ValueError(
                f"no GPU memory left for the KV cache: weights {self.weights / GiB:.2f} GiB + "
                f"activation peak {self.activation_peak / GiB:.2f} GiB + outside torch "
                f"{self.non_torch / GiB:.2f} GiB exceed {self.usable / GiB:.2f} GiB "
                f"({self.total / GiB:.2f} GiB x gpu_memory_utilization {self.utilization}); "
                f"raise gpu_memory_utilization or lower max_num_batched_tokens")
        return budget

    def lines(self) -> list[str]:
        return [
            f"GPU memory:         {self.total / GiB:8.2f} GiB x utilization {self.utilization} "
            f"= {self.usable / GiB:.2f} GiB",
            f"weights:            {self.weights / GiB:8.2f} GiB",
            f"activation peak:    {self.activation_peak / GiB:8.2f} GiB (profiled at "
            f"{self.profiled_tokens} tokens)",
            f"outside torch:      {self.non_torch / GiB:8.2f} GiB (CUDA context, libraries)",
            f"KV budget:          {self.kv_budget / GiB:8.2f} GiB",
        ]


def profile_requests(num_tokens: int, max_num_seqs: int, max_model_len: int,
                     block_size: int) -> tuple[list[ScheduledRequest], int]:
    """Prompts totalling `num_tokens` (min(max_num_seqs, num_tokens) of them, more if one
    would exceed max_model_len), each with its own blocks: (scheduled prompts, blocks)."""
    num = min(max_num_seqs, num_tokens)
    num = max(num, -(-num_tokens // max_model_len))
    lengths = [num_tokens // num + (i < num_tokens % num) for i in range(num)]
    scheduled, next_block = [], 0
    for i, n in enumerate(lengths):
        req = Request(f"profile-{i}", [0] * n, SamplingParams(temperature=1.0, top_p=0.9,
                                                                top_k=50, logprobs=1),
                      eos_token_id=None)
        blocks = -(-n // block_size)
        req.block_ids = list(range(next_block, next_block + blocks))
        next_block += blocks
        scheduled.append(ScheduledRequest(req, n))
    return scheduled, next_block


@torch.inference_mode()
def profile(model: nn.Module, spec: KVCacheSpec, config: EngineConfig, vocab_size: int,
            attention_backend: PagedAttentionBackend) -> GpuMemoryPlan:
    """Run the profiling step on CUDA through the rank's attention backend and return the
    plan (see the module docstring)."""
    from pagedllm.model.layers.sampler import Sampler, SamplingMetadata, SamplingRow
    from pagedllm.worker.cache_engine import CacheEngine
    from pagedllm.worker.input_batch import build_inputs

    device = config.torch_device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    weights = torch.cuda.memory_allocated(device)
    tokens = config.max_num_batched_tokens
    scheduled, blocks = profile_requests(tokens, config.max_num_seqs, config.max_model_len,
                                         spec.block_size)
    scratch = CacheEngine(spec, blocks, device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    batch = build_inputs(scheduled, spec.block_size, attention_backend, layout=spec.groups)
    hidden = model(batch.input_ids, batch.positions, batch.max_pos, scratch.layer_caches,
                   batch.meta)
    logits = model.compute_logits(hidden[torch.as_tensor(batch.logits_indices, device=device)])
    rows = [SamplingRow(s.request.sampling_params, s.request.prompt_token_ids, [])
            for s in batch.order]
    Sampler()(logits, SamplingMetadata.build(rows, vocab_size, device))
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del scratch, batch, hidden, logits
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    non_torch = max(0, (total - free) - torch.cuda.memory_reserved(device))
    plan = GpuMemoryPlan(total=total, utilization=config.gpu_memory_utilization,
                         weights=weights, activation_peak=peak, non_torch=non_torch,
                         profiled_tokens=tokens)
    for line in plan.lines():
        logger.info("%s", line)
    return plan
