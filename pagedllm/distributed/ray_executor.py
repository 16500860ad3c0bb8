"""Tensor-parallel workers as Ray actors, placed with a placement group (multi-node).

Ray only places and supervises the workers; the forward pass's collectives still run over
torch.distributed (gloo / NCCL), whose rendezvous is on the engine's node
(tcp://<driver node ip>:<free port>). Each step's message goes to every actor as one actor
call (`execute`); calls to an actor run in order. A dead actor fails its pending calls
(checked before every step and while idle) and the collectives of the step it was in.

The cluster: `ray.init()` joins the one in $RAY_ADDRESS (e.g. a head started with
`ray start --head`), else starts a local one. `pip install pagedllm[ray]`.
"""

from __future__ import annotations

import logging
import os

from pagedllm.config import EngineConfig
from pagedllm.distributed.errors import WorkerDied
from pagedllm.distributed.executor import TPExecutor
from pagedllm.distributed.parallel_state import (
    collective_timeout_s,
    init_tp_group,
    rendezvous_port,
)
from pagedllm.distributed.sharding import TPLayout
from pagedllm.distributed.worker import TPWorker, rank_threads

logger = logging.getLogger(__name__)


class _RayWorker:
    """The actor body: a TPWorker built in steps the driver can wait on."""

    def __init__(self, rank: int, config: EngineConfig, init_method: str) -> None:
        self.rank, self.config, self.init_method = rank, config, init_method
        self.worker: TPWorker | None = None

    def join(self) -> int:
        self.worker = TPWorker(self.rank, self.config, self.init_method, cuda_device=0)
        return os.getpid()

    def load(self) -> None:
        self.worker.load()

    def allocate_cache(self, num_blocks: int, num_swap_blocks: int) -> None:
        self.worker.allocate_cache(num_blocks, num_swap_blocks)

    def execute(self, data: bytes) -> bool:
        return self.worker.execute(data)


def connect_ray():
    """The `ray` module, connected: to $RAY_ADDRESS if set, else a local cluster (TP ranks
    and DP replicas alike). ValueError with the install hint when Ray is missing."""
    try:
        import ray
    except ImportError as exc:
        raise ValueError("distributed_executor_backend 'ray' needs Ray: "
                         "pip install 'pagedllm[ray]'") from exc
    if not ray.is_initialized():
        ray.init(log_to_driver=False)
    return ray


class RayExecutor(TPExecutor):
    def __init__(self, config: EngineConfig, layout: TPLayout) -> None:
        ray = connect_ray()
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ray = ray
        self.layout = layout
        threads = rank_threads(config)
        bundle = {"GPU": 1} if config.torch_device.type == "cuda" else {"CPU": threads}
        strategy = os.environ.get("PAGEDLLM_RAY_PLACEMENT_STRATEGY", "PACK")
        self.placement = placement_group([dict(bundle)] * (layout.world_size - 1),
                                         strategy=strategy)
        timeout = collective_timeout_s()
        try:
            ray.get(self.placement.ready(), timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise WorkerDied(f"the Ray cluster has no room for {layout.world_size - 1} "
                             f"workers of {bundle} ({strategy}) after {timeout:.0f} s") from None
        host = ray.util.get_node_ip_address()
        init_method = f"tcp://{host}:{rendezvous_port(host)}"
        actor_cls = ray.remote(num_cpus=0 if "GPU" in bundle else threads,
                               num_gpus=bundle.get("GPU", 0))(_RayWorker)
        self.actors = [
            actor_cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement, placement_group_bundle_index=rank - 1)).remote(
                    rank, config, init_method)
            for rank in range(1, layout.world_size)]
        joined = [a.join.remote() for a in self.actors]
        self.group = init_tp_group(0, layout.world_size, init_method, config.torch_device)
        pids = self._get(joined, "join the process group")
        self._pending: list = [a.load.remote() for a in self.actors]
        logger.info("tensor parallel: %d ranks (ray actors, pids %s), %s", layout.world_size,
                    pids, init_method)

    def _get(self, refs, what: str):
        ray = self._ray
        try:
            return ray.get(refs, timeout=collective_timeout_s())
        except (ray.exceptions.RayError, TimeoutError) as exc:
            raise WorkerDied(f"tensor-parallel Ray workers failed to {what}: {exc}") from exc

    def start(self, num_blocks: int, num_swap_blocks: int) -> None:
        self._get(self._pending, "load their weights")
        self._pending = []
        self._get([a.allocate_cache.remote(num_blocks, num_swap_blocks) for a in self.actors],
                  "allocate their KV cache")

    def broadcast(self, data: bytes) -> None:
        self._pending.extend(a.execute.remote(data) for a in self.actors)

    def check_health(self) -> None:
        """Collect the finished step calls; a failed one (dead actor) raises WorkerDied."""
        if not self._pending:
            return
        ray = self._ray
        done, self._pending = ray.wait(self._pending, num_returns=len(self._pending),
                                       timeout=0)
        try:
            ray.get(done)
        except ray.exceptions.RayError as exc:
            raise WorkerDied(f"a tensor-parallel Ray worker failed: {exc}") from exc

    def _stop_workers(self) -> None:
        ray = self._ray
        for actor in self.actors:
            ray.kill(actor)
        ray.util.remove_placement_group(self.placement)
