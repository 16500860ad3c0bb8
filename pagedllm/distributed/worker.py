"""A tensor-parallel rank > 0: its shard of the model and of the KV cache, stepped by rank 0.

Each step it receives a `StepMessage`, applies the swaps / copies to its KV shard, runs the
forward pass on the same batch (its collectives pair with rank 0's) and, when rank 0 computes
logits, takes part in the vocab gather. It never schedules or samples. The same class runs
in an mp worker process (mp_executor) and in a Ray actor (ray_executor).
"""

from __future__ import annotations

import dataclasses
import logging
import os

import torch

from pagedllm.config import EngineConfig
from pagedllm.distributed.parallel_state import TPGroup, init_tp_group
from pagedllm.distributed.sharding import TPLayout
from pagedllm.distributed.step_message import Kind, StepMessage
from pagedllm.worker.cache_engine import CacheEngine
from pagedllm.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def rank_threads(config: EngineConfig) -> int:
    """CPU threads of one rank: --num-threads, else the cores split evenly over the ranks."""
    if config.num_threads:
        return config.num_threads
    return max(1, (os.cpu_count() or 1) // config.tensor_parallel_size)


class TPWorker:
    def __init__(self, rank: int, config: EngineConfig, init_method: str,
                 cuda_device: int | None = None) -> None:
        """`cuda_device`: the GPU of this rank on a CUDA engine (mp: its rank; a Ray actor
        sees only its own GPU, device 0)."""
        torch.set_num_threads(rank_threads(config))
        if config.torch_device.type == "cuda":
            index = rank if cuda_device is None else cuda_device
            config = dataclasses.replace(config, device=f"cuda:{index}")
            torch.cuda.set_device(config.torch_device)
        self.rank = rank
        self.config = config
        self.group: TPGroup = init_tp_group(rank, config.tensor_parallel_size, init_method,
                                            config.torch_device)
        self.model = None
        self.runner: ModelRunner | None = None  # once the KV shard is allocated
        self.attention_backend = None

    def load(self) -> None:
        """Load this rank's shard: the engine's own start-up (worker/rank_builder.py)."""
        from pagedllm.worker.rank_builder import build_rank, prepare_checkpoint

        ckpt = prepare_checkpoint(self.config)
        layout = TPLayout.for_model(ckpt.config, self.rank, self.config.tensor_parallel_size,
                                    self.config.enable_expert_parallel)
        parts = build_rank(self.config, ckpt, tp=(layout, self.group))
        self.model, self.kv_spec = parts.model, parts.kv_spec
        self.attention_backend = parts.attention_backend
        self.vocab_size = ckpt.config.vocab_size

    def allocate_cache(self, num_blocks: int, num_swap_blocks: int) -> None:
        """This rank's KV shard (rank 0's block count) and its ModelRunner: the same runner
        class as rank 0, which replays each step instead of scheduling and sampling."""
        cache = CacheEngine(self.kv_spec, num_blocks, self.config.torch_device,
                            num_swap_blocks=num_swap_blocks)
        self.runner = ModelRunner(self.model, cache, self.attention_backend,
                                  vocab_size=self.vocab_size, device=self.config.torch_device)

    def execute(self, data: bytes) -> bool:
        """Replay one step of rank 0; False once rank 0 sent SHUTDOWN."""
        msg = StepMessage.decode(data)
        if msg.kind is Kind.SHUTDOWN:
            return False
        self.runner.replay(msg.host, msg.logits_rows.copy(),
                           [tuple(p) for p in msg.swap_out.tolist()],
                           [tuple(p) for p in msg.swap_in.tolist()],
                           [tuple(p) for p in msg.copies.tolist()])
        return True

    def shutdown(self) -> None:
        self.group.destroy()
