"""Tensor-parallel workers as local processes (multiprocessing, spawn), one per rank > 0.

Rank 0 talks to each worker over a pipe: the encoded StepMessage per step, start-up
acknowledgements back. A worker waits for messages with a bounded poll and exits when its
parent is gone; rank 0 checks the workers' exit codes before every step and while idle, and
any failure inside a step (a collective whose peer died, or timed out) is fatal: the ranks
are no longer in step.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import threading
import time
import traceback

from pagedllm.config import EngineConfig
from pagedllm.distributed.errors import WorkerDied
from pagedllm.distributed.executor import TPExecutor
from pagedllm.distributed.parallel_state import (
    collective_timeout_s,
    init_tp_group,
    rendezvous_port,
)
from pagedllm.distributed.sharding import TPLayout

logger = logging.getLogger(__name__)

_POLL_S = 0.5


def _worker_main(rank: int, config: EngineConfig, init_method: str, conn,
                 parent_pid: int) -> None:
    logging.basicConfig(level=logging.WARNING,
                        format=f"%(asctime)s tp-rank{rank} %(levelname)s %(name)s: %(message)s")

    def recv_bytes() -> bytes:
        while not conn.poll(_POLL_S):
            if os.getppid() != parent_pid:  # the engine is gone: nobody will step us
                os._exit(1)
        return conn.recv_bytes()

    from pagedllm.distributed.worker import TPWorker

    try:
        worker = TPWorker(rank, config, init_method)
        worker.load()
        conn.send(("loaded", None))
        worker.allocate_cache(*conn.recv())
        conn.send(("ready", None))
        while worker.execute(recv_bytes()):
            pass
        worker.shutdown()
    except BaseException:  # noqa: BLE001 - report to rank 0, then die
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
        os._exit(1)
    os._exit(0)


class MPExecutor(TPExecutor):
    def __init__(self, config: EngineConfig, layout: TPLayout) -> None:
        self.layout = layout
        ctx = mp.get_context("spawn")
        host = os.environ.get("PAGEDLLM_TP_HOST", "127.0.0.1")
        init_method = f"tcp://{host}:{rendezvous_port(host)}"
        self.procs: list = []
        self.conns: list = []
        for rank in range(1, layout.world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, name=f"pagedllm-tp{rank}", daemon=True,
                               args=(rank, config, init_method, child, os.getpid()))
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)
        self.group = self._join(init_method, config)
        logger.info("tensor parallel: %d ranks (mp, pids %s), %s", layout.world_size,
                    [p.pid for p in self.procs], init_method)

    def _join(self, init_method: str, config: EngineConfig):
        """Join the group in a thread so that a worker dying before it joins fails fast."""
        box: dict = {}

        def join() -> None:
            try:
                box["group"] = init_tp_group(0, self.layout.world_size, init_method,
                                             config.torch_device)
            except BaseException as exc:  # noqa: BLE001
                box["error"] = exc

        thread = threading.Thread(target=join, name="pagedllm-tp-join", daemon=True)
        thread.start()
        deadline = time.monotonic() + collective_timeout_s()
        while thread.is_alive():
            thread.join(_POLL_S)
            self.check_health()
            if time.monotonic() > deadline:
                raise WorkerDied("tensor-parallel workers did not join the process group in "
                                 f"{collective_timeout_s():.0f} s")
        if "error" in box:
            raise WorkerDied(f"joining the tensor-parallel group failed: {box['error']!r}")
        return box["group"]

    def _expect(self, what: str) -> None:
        deadline = time.monotonic() + collective_timeout_s()
        for rank, (_proc, conn) in enumerate(zip(self.procs, self.conns, strict=True), 1):
            while not conn.poll(_POLL_S):
                self.check_health()
                if time.monotonic() > deadline:
                    raise WorkerDied(f"tensor-parallel rank {rank} did not report {what!r}")
            kind, detail = conn.recv()
            if kind == "error":
                raise WorkerDied(f"tensor-parallel rank {rank} failed:\n{detail}")
            if kind != what:
                raise WorkerDied(f"tensor-parallel rank {rank} sent {kind!r}, expected {what!r}")

    def start(self, num_blocks: int, num_swap_blocks: int) -> None:
        self._expect("loaded")
        for conn in self.conns:
            conn.send((num_blocks, num_swap_blocks))
        self._expect("ready")

    def broadcast(self, data: bytes) -> None:
        for rank, conn in enumerate(self.conns, 1):
            try:
                conn.send_bytes(data)
            except OSError as exc:
                raise WorkerDied(f"tensor-parallel rank {rank} is gone ({exc})") from exc

    def check_health(self) -> None:
        for rank, proc in enumerate(self.procs, 1):
            if proc.exitcode is not None:
                raise WorkerDied(f"tensor-parallel worker rank {rank} (pid {proc.pid}) exited "
                                 f"with code {proc.exitcode}")

    def _stop_workers(self) -> None:
        for proc in self.procs:
            proc.join(5.0)
            if proc.exitcode is None:
                proc.terminate()
                proc.join(5.0)
