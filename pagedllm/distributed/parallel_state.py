"""The tensor-parallel process group of one engine (torch.distributed).

Rank 0 is the engine process (scheduler, block manager, sampler); ranks 1..N-1 are workers.
Every rank joins one group through a TCP rendezvous (`init_method`, e.g.
tcp://127.0.0.1:29500): gloo on CPU, NCCL on CUDA. Collectives have a bounded timeout
($PAGEDLLM_DIST_TIMEOUT_S, default 300 s), so a rank that stops answering fails the others
instead of hanging them forever.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0


def collective_timeout_s() -> float:
    value = os.environ.get("PAGEDLLM_DIST_TIMEOUT_S")
    return float(value) if value else DEFAULT_TIMEOUT_S


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (for the rendezvous)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rendezvous_port(host: str) -> int:
    """$PAGEDLLM_TP_PORT (a port a firewall lets through), else any free port on `host`."""
    value = os.environ.get("PAGEDLLM_TP_PORT")
    return int(value) if value else free_port(host)


@dataclass
class TPGroup:
    """This process's place in the tensor-parallel group and its collectives."""

    rank: int
    world_size: int
    backend: str

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place (every rank gets the same result)."""
        dist.all_reduce(x)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's `x` along the last dim, rank order."""
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def init_tp_group(rank: int, world_size: int, init_method: str,
                  device: torch.device) -> TPGroup:
    """Join the group (blocks until all `world_size` ranks have joined, or the timeout)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=collective_timeout_s())
    dist.init_process_group(backend, init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timeout)
    logger.info("tensor-parallel rank %d/%d joined (%s, %s)", rank, world_size, backend,
                init_method)
    return TPGroup(rank, world_size, backend)
