"""Rank 0's handle on the other tensor-parallel ranks (vLLM's executor).

    engine start-up                      every step (ModelRunner hook)
    ---------------                      -----------------------------
    start_tensor_parallel(config, ckpt)  executor.send_step(batch, ...)  -> ranks 1..N-1
      spawn ranks 1..N-1 (mp | ray),     rank 0 then runs the same forward; the collectives
      join the process group             inside it pair with the workers'
    build rank 0's shard, plan blocks
    executor.start(num_blocks, swap)     check_health(): raises WorkerDied if a rank is gone

The scheduler, block manager and sampler exist only on rank 0; a worker receives the compact
arrays of each step (step_message.py), never request objects.
"""

from __future__ import annotations

import abc
import contextlib
import logging

from pagedllm.config import EngineConfig
from pagedllm.distributed.errors import WorkerDied
from pagedllm.distributed.parallel_state import TPGroup
from pagedllm.distributed.sharding import TPLayout
from pagedllm.distributed.step_message import Kind, StepMessage

logger = logging.getLogger(__name__)


class TPExecutor(abc.ABC):
    """Owns ranks 1..N-1; rank 0 (this process) holds `group` and `layout`."""

    layout: TPLayout
    group: TPGroup

    @property
    def shard(self) -> tuple[TPLayout, TPGroup]:
        return self.layout, self.group

    @abc.abstractmethod
    def start(self, num_blocks: int, num_swap_blocks: int) -> None:
        """Wait for every rank's weights, then size their KV shards (blocks as rank 0's)."""

    @abc.abstractmethod
    def broadcast(self, data: bytes) -> None:
        """Hand one encoded message to every worker (raises WorkerDied if one is gone)."""

    @abc.abstractmethod
    def check_health(self) -> None:
        """Raise WorkerDied if a worker has died."""

    @abc.abstractmethod
    def _stop_workers(self) -> None: ...

    def send_step(self, host, logits_rows: list[int], swap_out, swap_in, copies) -> None:
        """Rank 0's step for the other ranks: its batch (`HostBatch`, None for a step that
        only moves blocks), the rows it computes logits for and its block moves."""
        self.check_health()
        self.broadcast(StepMessage.step(host, logits_rows, swap_out, swap_in, copies).encode())

    def shutdown(self) -> None:
        """Tell the workers to exit, then leave the group (idempotent)."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        with contextlib.suppress(WorkerDied):
            self.broadcast(StepMessage(Kind.SHUTDOWN).encode())
        self._stop_workers()
        self.group.destroy()


def weight_format_before_loading(config: EngineConfig) -> str | None:
    """The weight format `config` will load, read without loading anything: --quantization
    when given, else "gguf" for a local .gguf file (the default model is one), else the
    `quant_method` of a local HF directory's config.json ("none" without one). None for a
    Hub name (known once it is resolved, which may download it)."""
    import json
    from pathlib import Path

    from pagedllm.loader.default_model import default_model_path

    if config.quantization is not None:
        return config.quantization
    path = default_model_path() if config.model is None else Path(config.model).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return "gguf"
    if (path / "config.json").is_file():
        qc = json.loads((path / "config.json").read_text()).get("quantization_config") or {}
        return qc.get("quant_method", "none") if qc else "none"
    return None


def check_tensor_parallel(config: EngineConfig, method: str | None) -> None:
    """Raise ValueError for what tensor parallelism does not support yet: quantized weights
    other than GGUF's (`method`, None = not known yet), LoRA, speculative decoding.
    `pagedllm serve` runs it with `weight_format_before_loading` before loading anything, the
    engine again with the checkpoint's own format."""
    n = config.tensor_parallel_size
    if n == 1:
        return
    if method not in (None, "none", "gguf"):
        raise ValueError(f"tensor_parallel_size {n}: quantized weights ({method}) are not "
                         f"supported with tensor parallelism yet (GGUF files are); pass "
                         f"--quantization none (quantization='none') to load them "
                         f"dequantized, or use tensor_parallel_size 1")
    if config.enable_lora:
        raise ValueError(f"tensor_parallel_size {n}: LoRA is not supported with tensor "
                         "parallelism yet")
    if config.speculative_config is not None:
        raise ValueError(f"tensor_parallel_size {n}: speculative decoding is not supported "
                         "with tensor parallelism yet")


def start_tensor_parallel(config: EngineConfig, ckpt) -> TPExecutor | None:
    """The executor of a tensor_parallel_size > 1 engine (None for 1); refuses what TP does
    not support yet with a ValueError before any process starts."""
    n = config.tensor_parallel_size
    if n == 1:
        return None
    layout = TPLayout.for_model(ckpt.config, 0, n, config.enable_expert_parallel)
    check_tensor_parallel(config, config.quantization or ckpt.quantization)
    if config.distributed_executor_backend == "ray":
        from pagedllm.distributed.ray_executor import RayExecutor

        return RayExecutor(config, layout)
    from pagedllm.distributed.mp_executor import MPExecutor

    return MPExecutor(config, layout)
