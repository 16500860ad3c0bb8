"""Where data-parallel replicas run: local processes (mp) or Ray actors (ray).

Either way a replica connects back to the front's listener (multiprocessing.connection over
TCP, with an authkey), so the front speaks the same protocol to both; a launcher only starts
replicas, says whether one has exited, and stops them.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os

from pagedllm.config import EngineConfig
from pagedllm.data_parallel.replica import replica_main

logger = logging.getLogger(__name__)


class ProcessReplicas:
    """Replicas as spawned local processes (not daemonic: a replica may start TP workers)."""

    host = "127.0.0.1"

    def __init__(self, num: int, threads: int) -> None:
        self._ctx = mp.get_context("spawn")
        self.procs: list = []

    def start(self, index: int, config: EngineConfig, address, authkey: bytes) -> None:
        proc = self._ctx.Process(target=replica_main, name=f"pagedllm-dp{index}",
                                 args=(index, config, address, authkey))
        proc.start()
        self.procs.append(proc)

    def exitcode(self, index: int) -> int | None:
        return self.procs[index].exitcode

    def sentinels(self, indices: list[int]) -> list:
        return [self.procs[i].sentinel for i in indices]

    def stop(self) -> None:
        for proc in self.procs:
            proc.join(10.0)
            if proc.exitcode is None:
                proc.terminate()
                proc.join(5.0)


class _ReplicaActor:
    def run(self, index: int, config: EngineConfig, address, authkey: bytes) -> None:
        replica_main(index, config, address, authkey)


class RayReplicas:
    """Replicas as Ray actors, one placement-group bundle each ($RAY_ADDRESS or a local
    cluster, as for tensor parallelism)."""

    def __init__(self, num: int, threads: int) -> None:
        from pagedllm.distributed.ray_executor import connect_ray

        ray = connect_ray()
        from ray.util.placement_group import placement_group

        self._ray = ray
        self.host = ray.util.get_node_ip_address()
        strategy = os.environ.get("PAGEDLLM_RAY_PLACEMENT_STRATEGY", "PACK")
        self.placement = placement_group([{"CPU": threads}] * num, strategy=strategy)
        self._actor_cls = ray.remote(num_cpus=threads)(_ReplicaActor)
        self.actors: list = []
        self.runs: list = []

    def start(self, index: int, config: EngineConfig, address, authkey: bytes) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        actor = self._actor_cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            self.placement, placement_group_bundle_index=index)).remote()
        self.actors.append(actor)
        self.runs.append(actor.run.remote(index, config, address, authkey))

    def exitcode(self, index: int) -> int | None:
        ray = self._ray
        done, _ = ray.wait([self.runs[index]], timeout=0)
        if not done:
            return None
        try:
            ray.get(done[0])
        except ray.exceptions.RayError:
            return 1
        return 0

    def sentinels(self, indices: list[int]) -> list:
        return []  # a dead actor's connection reads as closed

    def stop(self) -> None:
        for actor in self.actors:
            self._ray.kill(actor)
        self._ray.util.remove_placement_group(self.placement)
