"""LLMEngine: add_request / abort_request / step, synchronous and single-threaded.

One `step()` is three calls (vLLM v1's shape)::

    sched   = scheduler.schedule()                         what runs, which blocks move
    result  = runner.execute(sched)                        forward + sample (RunnerOutput)
    update  = scheduler.update_from_output(sched, result)  tokens, drafts, stops, frees

then the output processor detokenizes what the update appended (stop strings and failed
requests go back to the scheduler), the speculative proposer proposes the next drafts, and the
touched request groups' outputs are returned. `AsyncEngine` (server) and `LLM` (offline) both
drive this loop. Start-up is engine/engine_builder.py; request validation engine/intake.py.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Sequence

from pagedllm.config import EngineConfig
from pagedllm.core.request import RequestStatus
from pagedllm.distributed.errors import WorkerDied
from pagedllm.engine.engine_builder import build_engine
from pagedllm.engine.engine_checks import EngineChecks
from pagedllm.lora.adapter import LoRAAdapter
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import RequestOutput, RequestOutputKind
from pagedllm.pooling.outputs import PoolingRequestOutput
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class LLMEngine(EngineChecks):
    def __init__(self, config: EngineConfig, debug_steps: bool = False) -> None:
        self.config = config
        self.debug_steps = debug_steps
        t_start = time.perf_counter()
        parts = build_engine(config, owner=self)
        # The engine's attributes are its parts (engine_builder.EngineParts): scheduler,
        # runner, output_processor, intake, block_manager, stats, tokenizer, model, ...
        vars(self).update({f.name: getattr(parts, f.name) for f in dataclasses.fields(parts)})
        self._ids = itertools.count()
        logger.info("start-up: engine ready in %.2f s", time.perf_counter() - t_start)

    @classmethod
    def from_engine_args(cls, debug_steps: bool = False, **kwargs) -> LLMEngine:
        return cls(EngineConfig(**kwargs), debug_steps=debug_steps)

    # -------------------------------------------------------------- requests
    def add_request(self, prompt: str | Sequence[int] | dict,
                    params: SamplingParams | PoolingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None,
                    cache_salt: str | None = None,
                    lora_request: LoRARequest | None = None, priority: int = 0) -> str:
        """Queue a request; raises ValueError (and queues nothing) on invalid input.

        Requests with different `cache_salt`s never share prefix-cache blocks (tenants), nor
        do requests with different LoRA adapters. `lora_request` None runs the base model.
        `priority` (lower runs earlier) needs scheduling_policy "priority". vLLM's positional
        order, `add_request(request_id, prompt, params)`, is accepted too.
        """
        prompt, params, request_id = _argument_order(prompt, params, request_id)
        request_id = request_id or str(next(self._ids))
        if request_id in self.output_processor:
            raise ValueError(f"request_id {request_id!r} is already in use")
        req = self.intake.make_request(
            request_id, prompt, params or SamplingParams(), arrival_time=arrival_time,
            cache_salt=cache_salt, lora_request=lora_request, priority=priority)
        self.output_processor.add(req)
        self.scheduler.add_request(req)
        self.stats.on_add(req.num_prompt_tokens)
        self._update_gauges()
        return request_id

    def load_lora(self, lora_request: LoRARequest) -> LoRAAdapter:
        """The validated adapter of `lora_request` (loaded into the CPU cache if needed)."""
        return self.intake.load_lora(lora_request)

    def abort_request(self, request_ids: str | Sequence[str]) -> None:
        """Finish the requests as aborted and free their blocks (unknown ids are ignored)."""
        unfinished = []
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            seqs = self.output_processor.remove(rid)
            if seqs is not None:
                unfinished += seqs  # finish_requests skips the finished ones
                self.stats.on_finish("abort")
        self.scheduler.finish_requests(unfinished, RequestStatus.FINISHED_ABORTED)
        self._update_gauges()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def get_num_unfinished_requests(self) -> int:
        return len(self.output_processor)

    # ------------------------------------------------------------------ step
    def step(self, stream: bool = False, *, final_only: bool = False) -> list[RequestOutput]:
        """One engine step. Outputs: cumulative (default), deltas (`stream`, see
        RequestOutputKind.DELTA) or only the requests that finished (`final_only`)."""
        kind = (RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY
                if final_only else RequestOutputKind.CUMULATIVE)
        t0 = time.perf_counter()
        sched = self.scheduler.schedule()
        t1 = time.perf_counter()
        if sched.is_empty:
            return []
        try:
            result = self.runner.execute(sched)
        except Exception as exc:
            if self.executor is not None:  # the ranks are out of step: nothing can go on
                raise WorkerDied(f"tensor-parallel step failed: {exc!r}") from exc
            raise
        t2 = time.perf_counter()
        update = self.scheduler.update_from_output(sched, result)
        processed = self.output_processor.process(update)
        self.scheduler.apply_stop_strings(processed.stop_strings, update)
        self.scheduler.finish_requests(processed.to_abort, RequestStatus.FINISHED_ABORTED)
        if self.speculator is not None:
            self.scheduler.set_draft_tokens(
                self.speculator.propose(result, self.scheduler.running, self.block_manager))
        outputs = []
        for gid in processed.touched:
            if final_only and not self.output_processor.is_finished(gid):
                continue
            outputs.append(self._output(gid, kind))
        t3 = time.perf_counter()
        self._update_gauges()
        self.stats.on_step(sched, result, update.num_tokens, {
            "schedule": (t1 - t0) * 1e3, **result.timings_ms, "output": (t3 - t2) * 1e3})
        if self.debug_steps:
            logger.info(self.stats.step_line())
        return outputs

    def _output(self, group_id: str, kind: RequestOutputKind) -> RequestOutput:
        """The group's output; a finished group leaves the engine (a group whose output
        could not be built is finished with an error: its sequences are aborted)."""
        seqs = self.output_processor.sequences(group_id)
        out = self.output_processor.make_output(group_id, kind=kind)
        if out.finished:  # any sequence still unfinished (an error) is aborted
            self.scheduler.finish_requests(seqs, RequestStatus.FINISHED_ABORTED)
            self.stats.on_finish("error" if out.error is not None else "stop"
                                 if isinstance(out, PoolingRequestOutput)
                                 else out.outputs[0].finish_reason or "abort")
        return out

    def reset_stats(self) -> None:
        """Counters back to zero (after the warm-up request): metrics start clean."""
        self.stats = self.stats.cleared()

    def _update_gauges(self) -> None:
        self.stats.observe_queues(self.scheduler, self.block_manager)


_PARAMS = (SamplingParams, PoolingParams)


def _argument_order(prompt, params, request_id) -> tuple:
    """(prompt, params, request_id) of an `add_request` call, in this engine's order or in
    vLLM's (request_id, prompt, params): the params object says which. Anything else in the
    params place is a TypeError that names the order (a dict there used to fail deep inside
    with "unhashable type")."""
    if isinstance(request_id, _PARAMS) and not isinstance(params, _PARAMS):
        prompt, params, request_id = params, request_id, prompt  # vLLM's order
    if params is not None and not isinstance(params, _PARAMS):
        raise TypeError("add_request(prompt, params, request_id) or vLLM's add_request("
                        "request_id, prompt, params): params must be SamplingParams or "
                        f"PoolingParams, got {type(params).__name__}")
    if request_id is not None and not isinstance(request_id, str):
        raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
    return prompt, params, request_id
