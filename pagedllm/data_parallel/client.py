"""DPEngine: LLMEngine's interface (for AsyncEngine and the serving layer) over N replica
processes, each a whole engine (replica.py), with requests routed by router.py.

`add_request` routes and waits for the replica's acceptance (so bad input is still a
ValueError at add time); `step` gathers whatever outputs the replicas have sent (waiting a
few ms at most). A replica that dies is taken out of rotation and its requests finish with
an error; when none is left the front raises EngineFatalError (the server exits non-zero).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Sequence
from multiprocessing.connection import Listener, wait

from pagedllm.config import EngineConfig
from pagedllm.data_parallel.launch import ProcessReplicas, RayReplicas
from pagedllm.data_parallel.router import PrefixAffinityRouter
from pagedllm.engine.engine_builder import eos_token_id_of, open_checkpoint
from pagedllm.engine.stats import EngineStats
from pagedllm.errors import EngineError, EngineFatalError
from pagedllm.outputs import CompletionOutput, RequestOutput
from pagedllm.pooling.setup import resolve_pooling
from pagedllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

_STEP_WAIT_S = 0.005
_START_TIMEOUT_S = 600.0


class ReplicaDied(EngineError):
    """The data-parallel replica serving a request died."""


class DPEngine:
    lora = None  # LoRA is not supported with data parallelism yet
    scheduler = None  # no queue limits with data parallelism (the replicas queue)

    def __init__(self, config: EngineConfig, debug_steps: bool = False) -> None:
        n = config.data_parallel_size
        if config.enable_lora:
            raise ValueError("data_parallel_size > 1: LoRA is not supported yet")
        self.config = config
        ckpt, self.model_name, self.sampling_defaults = open_checkpoint(config)
        if resolve_pooling(config, ckpt.config) is not None:
            raise ValueError("data_parallel_size > 1: pooling models (--runner pooling) are "
                             "not supported yet")
        self.tokenizer = ckpt.tokenizer
        self.vocab_size = ckpt.config.vocab_size
        self.eos_token_id = eos_token_id_of(ckpt)  # the replicas' (beam search reads it)
        threads = config.num_threads or max(1, (os.cpu_count() or 1) // n)
        replica_config = dataclasses.replace(config, data_parallel_size=1, num_threads=threads)
        self.replicas = (RayReplicas(n, threads)
                         if config.distributed_executor_backend == "ray"
                         else ProcessReplicas(n, threads))
        self.conns = self._connect(n, replica_config)
        self.pids = [self._wait_ready(i) for i in range(n)]
        for i, pid in enumerate(self.pids):
            logger.info("data-parallel replica %d ready (pid %d, %d threads)", i, pid, threads)
        self.router = PrefixAffinityRouter(n, config.block_size)
        self._owner: dict[str, int] = {}     # request id -> replica
        self._prompts: dict[str, tuple[str | None, list[int]]] = {}
        self._outputs: list[RequestOutput] = []  # received while waiting for an ack
        self._stats: list[EngineStats] = [EngineStats() for _ in range(n)]
        self._num_steps = 0

    def _connect(self, n: int, replica_config: EngineConfig) -> list:
        """Start the replicas; each connects back to this listener (authkey) and says hello."""
        authkey = os.urandom(16)
        listener = Listener((self.replicas.host, 0), authkey=authkey)
        accepted: dict[int, object] = {}

        def accept_all() -> None:
            for _ in range(n):
                try:
                    conn = listener.accept()
                    _, index, _pid = conn.recv()
                except (OSError, EOFError):
                    return
                accepted[index] = conn

        thread = threading.Thread(target=accept_all, name="pagedllm-dp-accept", daemon=True)
        thread.start()
        for i in range(n):
            self.replicas.start(i, replica_config, listener.address, authkey)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while thread.is_alive():
            thread.join(0.5)
            dead = [i for i in range(n) if self.replicas.exitcode(i) is not None]
            if dead or time.monotonic() > deadline:
                listener.close()
                self.replicas.stop()
                raise RuntimeError(f"data-parallel replicas {dead or list(range(n))} did not "
                                   "start")
        listener.close()
        return [accepted[i] for i in range(n)]

    def _wait_ready(self, i: int) -> int:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self.conns[i].poll(0.5):
            if self.replicas.exitcode(i) is not None or time.monotonic() > deadline:
                self.shutdown()
                raise RuntimeError(f"data-parallel replica {i} did not start "
                                   f"(exit code {self.replicas.exitcode(i)})")
        kind, detail = self.conns[i].recv()
        if kind != "ready":
            self.shutdown()
            raise RuntimeError(f"data-parallel replica {i} failed to start: {detail}")
        return detail

    # ------------------------------------------------------------ requests
    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None,
                    cache_salt: str | None = None, lora_request=None, priority: int = 0) -> str:
        if lora_request is not None:
            raise ValueError("LoRA adapters are not supported with data parallelism yet")
        if priority:
            raise ValueError("priority scheduling is not supported with data parallelism yet")
        if request_id is None or request_id in self._owner:
            raise ValueError(f"request_id {request_id!r} is missing or already in use")
        token_ids = (self.tokenizer.encode(prompt) if isinstance(prompt, str)
                     else list(prompt))
        replica = self.router.route(token_ids, cache_salt)
        try:
            self.conns[replica].send(("add", request_id, prompt, params or SamplingParams(),
                                      arrival_time, cache_salt))
            error = self._wait_ack(replica, request_id)
        except (OSError, EOFError, ReplicaDied):
            self._replica_died(replica)
            if not any(self.router.alive):
                raise EngineFatalError("every data-parallel replica died") from None
            raise ReplicaDied(f"data-parallel replica {replica} died while accepting request "
                              f"{request_id}") from None
        if error is not None:
            self.router.finished(replica)
            raise error
        self._owner[request_id] = replica
        self._prompts[request_id] = (prompt if isinstance(prompt, str) else None, token_ids)
        return request_id

    def _wait_ack(self, replica: int, request_id: str) -> BaseException | None:
        conn = self.conns[replica]
        while True:
            ready = wait([conn, *self.replicas.sentinels([replica])], timeout=None)
            if conn not in ready:
                raise ReplicaDied(replica)
            msg = conn.recv()  # EOFError: the replica is gone
            if msg[0] == "added" and msg[1] == request_id:
                return msg[2]
            self._handle(replica, msg)

    def abort_request(self, request_ids: str | Sequence[str]) -> None:
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            replica = self._owner.pop(rid, None)
            if replica is None:
                continue
            self._prompts.pop(rid, None)
            self.router.finished(replica)
            if self.router.alive[replica]:
                try:
                    self.conns[replica].send(("abort", [rid]))
                except OSError:
                    self._replica_died(replica)

    def has_unfinished_requests(self) -> bool:
        return bool(self._owner) or bool(self._outputs)

    def get_num_unfinished_requests(self) -> int:
        return len(self._owner)

    # ------------------------------------------------------------ outputs
    def step(self, stream: bool = True, *, final_only: bool = False) -> list[RequestOutput]:
        """Outputs the replicas sent since the last call (deltas: replicas stream)."""
        live = [i for i in range(len(self.conns)) if self.router.alive[i]]
        handles = [self.conns[i] for i in live] + self.replicas.sentinels(live)
        ready = wait(handles, timeout=0 if self._outputs else _STEP_WAIT_S)
        for i in live:
            conn = self.conns[i]
            try:
                while conn in ready and conn.poll(0):
                    self._handle(i, conn.recv())
            except (OSError, EOFError):  # its end of the connection closed: it is gone
                self._replica_died(i)
                continue
            if self.replicas.exitcode(i) is not None:
                self._replica_died(i)
        if not any(self.router.alive):
            raise EngineFatalError("every data-parallel replica died")
        outputs, self._outputs = self._outputs, []
        if outputs:
            self._num_steps += 1
        return outputs

    def _handle(self, replica: int, msg: tuple) -> None:
        kind = msg[0]
        if kind == "out":
            self._stats[replica] = msg[2]
            for out in msg[1]:
                if out.finished and self._owner.pop(out.request_id, None) is not None:
                    self._prompts.pop(out.request_id, None)
                    self.router.finished(replica)
                if out.request_id in self._owner or out.finished:
                    self._outputs.append(out)
        elif kind == "failed":
            for rid in msg[1]:
                self._fail(rid, msg[2])

    def _fail(self, rid: str, error: BaseException) -> None:
        replica = self._owner.pop(rid, None)
        if replica is None:
            return
        self.router.finished(replica)
        prompt, token_ids = self._prompts.pop(rid, (None, []))
        self._outputs.append(RequestOutput(rid, prompt, token_ids, [CompletionOutput(
            0, "", [], finish_reason="abort")], finished=True, error=error))

    def _replica_died(self, replica: int) -> None:
        if not self.router.alive[replica]:
            return
        code = self.replicas.exitcode(replica)
        logger.error("data-parallel replica %d (pid %d) died (exit code %s): out of rotation",
                     replica, self.pids[replica], code)
        self.router.mark_dead(replica)
        error = ReplicaDied(f"data-parallel replica {replica} died (exit code {code})")
        for rid in [r for r, owner in self._owner.items() if owner == replica]:
            self._fail(rid, error)

    # ------------------------------------------------------------ engine interface
    @property
    def stats(self) -> EngineStats:
        """The replicas' counters summed (gauges summed; kv_usage averaged)."""
        total = EngineStats()
        alive = [s for i, s in enumerate(self._stats) if self.router.alive[i]] or self._stats
        for f in dataclasses.fields(EngineStats):
            values = [getattr(s, f.name) for s in self._stats]
            if isinstance(values[0], bool):
                continue
            if isinstance(values[0], int):
                setattr(total, f.name, sum(values))
            elif isinstance(values[0], Counter):
                setattr(total, f.name, sum(values, Counter()))
        total.kv_usage = sum(s.kv_usage for s in alive) / len(alive)
        total.num_steps = self._num_steps
        return total

    def check_health(self) -> None:
        for i in range(len(self.conns)):
            if self.router.alive[i] and self.replicas.exitcode(i) is not None:
                self._replica_died(i)
        if not any(self.router.alive):
            raise EngineFatalError("every data-parallel replica died")

    def check_idle(self) -> None:
        """Each replica checks its own block accounting when it runs dry (nothing here)."""

    def shutdown(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        self.replicas.stop()
