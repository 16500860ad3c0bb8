"""LLMEngine: add_request / abort_request / step, synchronous and single-threaded.

One `step()` = schedule -> forward + sample -> append tokens, stop checks, free -> outputs.
`AsyncEngine` (server) and `LLM` (offline) both drive this loop.
"""

from __future__ import annotations

import itertools
import logging
import operator
import reprlib
import time
import weakref
from collections.abc import Sequence

import torch

from pagedllm.config import EngineConfig
from pagedllm.core.block_manager import BlockManager
from pagedllm.core.request import Request, RequestStatus
from pagedllm.core.scheduler import Scheduler
from pagedllm.core.swap_manager import SwapManager
from pagedllm.distributed.errors import WorkerDied
from pagedllm.distributed.executor import start_tensor_parallel
from pagedllm.distributed.worker import rank_threads
from pagedllm.engine import model_setup, startup
from pagedllm.engine.fault_injection import FaultInjector
from pagedllm.engine.output_processor import OutputProcessor
from pagedllm.engine.stats import EngineStats
from pagedllm.engine.token_restrictions import resolve_token_restrictions
from pagedllm.kernels import cpu_ops
from pagedllm.lora.adapter import LoRAAdapter
from pagedllm.lora.manager import LoRAManager
from pagedllm.lora.request import LoRARequest
from pagedllm.model.layers.rope_scaling import (
    rope_parameters,
)
from pagedllm.model.layers.sampler import make_generator
from pagedllm.outputs import RequestOutput, RequestOutputKind
from pagedllm.sampling_params import SamplingParams
from pagedllm.spec_decode.decoder import SpecDecoder
from pagedllm.structured_output.manager import StructuredOutputManager
from pagedllm.worker import cuda_graphs, gpu_memory
from pagedllm.worker.cache_engine import CacheEngine
from pagedllm.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig, debug_steps: bool = False) -> None:
        self.config = config
        self.debug_steps = debug_steps
        if config.num_threads or config.tensor_parallel_size > 1:
            torch.set_num_threads(rank_threads(config))
        t_start = time.perf_counter()
        if config.torch_device.type == "cpu":
            # Compile (first run only) or load now, before the checkpoint (a GGUF file asks
            # whether its kernels exist), the weight packing or a step: the build's minutes
            # are charged to this step.
            with startup.step("CPU kernels"):
                cpu_ops.load()
        with startup.step("checkpoint (config, tokenizer)"):
            ckpt, self.model_name, self.sampling_defaults = model_setup.open_checkpoint(config)
        self.hf_config = ckpt.config
        self.tokenizer = ckpt.tokenizer
        # Tensor parallelism: ranks 1..N-1 start loading their shards now (None for TP=1).
        self.executor = start_tensor_parallel(config, ckpt)
        if self.executor is not None:  # also when the rest of start-up raises
            weakref.finalize(self, self.executor.shutdown)
        tp = self.executor.shard if self.executor is not None else None
        with startup.step("weights"):
            self.model = model_setup.build_model(ckpt, config, tp=tp)
        self.lora = (LoRAManager(self.model, config.lora_config, config.torch_device,
                                 config.torch_dtype) if config.lora_config else None)
        self.vocab_size = ckpt.config.vocab_size
        eos = getattr(ckpt.config, "eos_token_id", None)
        if isinstance(eos, list):
            eos = eos[0]
        self.eos_token_id = eos if eos is not None else self.tokenizer.eos_token_id
        self.kv_spec, plan_spec = model_setup.kv_specs(ckpt.config, config, tp)
        budget = model_setup.kv_budget_bytes(config, profile_peak_bytes=self._gpu_peak())
        self.spec = None
        if config.speculative_config is not None:
            with startup.step(f"speculative decoding ({config.speculative_config.method})"):
                self.spec = SpecDecoder(config.speculative_config, config, self.vocab_size)
            if self.spec.draft_kv_spec is not None:  # a block holds target + draft KV
                own, draft = plan_spec.bytes_per_block, self.spec.draft_kv_spec.bytes_per_block
                budget = budget * own // (own + draft)
        self.num_blocks = model_setup.plan_num_blocks(plan_spec, budget, config.max_model_len,
                                                      model_dtype=config.torch_dtype,
                                                      chunk=config.max_num_batched_tokens)
        self.num_swap_blocks = model_setup.plan_swap_blocks(plan_spec, config)
        if self.executor is not None:
            self.executor.start(self.num_blocks, self.num_swap_blocks)
        with startup.step(f"KV pool {self.num_blocks * self.kv_spec.bytes_per_block / 2**30:.2f} GiB"):
            self.cache = CacheEngine(self.kv_spec, self.num_blocks, config.torch_device,
                                     num_swap_blocks=self.num_swap_blocks)
        if config.enable_prefix_caching and rope_parameters(ckpt.config).get(
                "rope_type") == "dynamic":
            logger.warning("prefix caching disabled: with dynamic NTK RoPE a key's rotation "
                           "depends on the length its sequence had when it was computed")
            config.enable_prefix_caching = False
        layout = self.kv_spec.groups
        if config.enable_prefix_caching and layout.groups[0].window is not None:
            logger.warning("prefix caching disabled: every layer has a sliding window whose "
                           "out-of-window blocks are freed (%s); pass "
                           "--disable-hybrid-kv-cache-manager to keep them and cache prefixes",
                           layout.describe())
            config.enable_prefix_caching = False
        self.block_manager = BlockManager(self.num_blocks, config.block_size,
                                          enable_caching=config.enable_prefix_caching,
                                          layout=layout)
        self.swap_manager = (SwapManager(self.num_swap_blocks, self.block_manager)
                             if config.preemption_mode == "swap" else None)
        self.scheduler = Scheduler(
            self.block_manager, max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len, swap_manager=self.swap_manager,
            max_loras=config.max_loras if self.lora else None,
            policy=config.scheduling_policy)
        window = model_setup.attention_window(ckpt.config, self.model)
        self.structured_output = StructuredOutputManager(self.tokenizer, self.vocab_size,
                                                         self.eos_token_id)
        draft = self.spec.draft if self.spec is not None else None
        if draft is not None:
            draft.allocate(self.num_blocks)
        graphs = None
        if (config.torch_device.type == "cuda" and not config.enforce_eager
                and self.spec is None and config.tensor_parallel_size == 1):
            with startup.step("CUDA graphs"):
                graphs = cuda_graphs.for_engine(self.model, self.cache, config, window,
                                                self.lora is not None)
        # Test-only fault injection (None unless $PAGEDLLM_TEST_FAULTS is set).
        self.faults = FaultInjector.from_env(self.tokenizer)
        self.runner = ModelRunner(self.model, self.cache, vocab_size=self.vocab_size,
                                  device=config.torch_device, sliding_window=window,
                                  seed=config.seed, lora=self.lora,
                                  structured_output=self.structured_output,
                                  workers=self.executor, draft=draft, graphs=graphs,
                                  faults=self.faults)
        self.output_processor = OutputProcessor(self.tokenizer, faults=self.faults)
        self.stats = EngineStats(max_lora=config.max_loras if self.lora else 0,
                                 spec_decode=self.spec.new_stats() if self.spec else None)
        self._ids = itertools.count()
        self._requests: dict[str, list[Request]] = {}
        logger.info("start-up: engine ready in %.2f s", time.perf_counter() - t_start)

    def _gpu_peak(self) -> int | None:
        """On CUDA without --kv-cache-memory: weights + profiled activation peak + memory
        outside torch (worker/gpu_memory.py); the budget is utilization x total minus it."""
        config = self.config
        if config.torch_device.type != "cuda" or config.kv_cache_memory is not None:
            return None
        plan = gpu_memory.profile(self.model, self.kv_spec, config, self.vocab_size)
        return plan.weights + plan.activation_peak + plan.non_torch

    @classmethod
    def from_engine_args(cls, debug_steps: bool = False, **kwargs) -> LLMEngine:
        return cls(EngineConfig(**kwargs), debug_steps=debug_steps)

    # -------------------------------------------------------------- requests
    def tokenize_prompt(self, prompt: str | Sequence[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        try:
            # operator.index takes ints (also numpy / integer tensor scalars), never floats,
            # strings or nested lists that int() would coerce or choke on.
            return None, [operator.index(t) for t in prompt]
        except TypeError:
            raise ValueError(
                "prompt must be a string or a list of token ids (or a dict with "
                f"'prompt_token_ids' or 'prompt'), got {reprlib.repr(prompt)}") from None

    def validate_prompt(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValueError("prompt must not be empty")
        if len(token_ids) > self.config.max_model_len:
            raise ValueError(
                f"prompt has {len(token_ids)} tokens, max_model_len is "
                f"{self.config.max_model_len}")
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token id {bad[0]} is out of range [0, {self.vocab_size})")

    def add_request(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                    request_id: str | None = None, arrival_time: float | None = None,
                    cache_salt: str | None = None,
                    lora_request: LoRARequest | None = None, priority: int = 0) -> str:
        """Queue a request; raises ValueError (and queues nothing) on invalid input.

        Requests with different `cache_salt`s never share prefix-cache blocks (tenants), nor
        do requests with different LoRA adapters. `lora_request` None runs the base model.
        `priority` (lower runs earlier) needs scheduling_policy "priority".
        """
        params = params or SamplingParams()
        request_id = request_id or str(next(self._ids))
        if request_id in self._requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        if priority and self.config.scheduling_policy != "priority":
            raise ValueError(f"priority {priority} given but the scheduling policy is "
                             f"{self.config.scheduling_policy!r} (--scheduling-policy priority)")
        if cache_salt is not None and not (isinstance(cache_salt, str) and cache_salt):
            raise ValueError(f"cache_salt must be a non-empty string, got {cache_salt!r}")
        if params.logprobs is not None and params.logprobs > self.config.max_logprobs:
            raise ValueError(f"logprobs must be <= max_logprobs ({self.config.max_logprobs}, "
                             f"--max-logprobs), got {params.logprobs}")
        text, token_ids = self.tokenize_prompt(prompt)
        self.validate_prompt(token_ids)
        resolve_token_restrictions(params, self.tokenizer, self.vocab_size)
        adapter = self.load_lora(lora_request) if lora_request is not None else None
        req = Request(request_id, token_ids, params, eos_token_id=self.eos_token_id,
                      prompt=text, arrival_time=arrival_time, cache_salt=cache_salt,
                      lora=adapter, priority=priority)
        if params.structured_outputs is not None:  # GrammarCompileError is a ValueError
            req.grammar = self.structured_output.grammar_for(params.structured_outputs)
        req.max_tokens = params.max_tokens or (self.config.max_model_len - len(token_ids))
        if params.seed is not None:
            req.generators = [make_generator(params.seed + i, self.config.torch_device)
                              for i in range(params.n)]
        self.output_processor.add(req)
        self.scheduler.add_request(req)
        self._requests[request_id] = self.output_processor.groups[request_id].seqs
        self.stats.on_add(len(token_ids))
        self._update_gauges()
        if self.faults is not None:
            self.faults.register(request_id, token_ids)
        return request_id

    def load_lora(self, lora_request: LoRARequest) -> LoRAAdapter:
        """The validated adapter of `lora_request` (loaded into the CPU cache if needed)."""
        if not isinstance(lora_request, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest, got {lora_request!r}")
        if self.lora is None:
            raise ValueError(f"lora_request {lora_request.lora_name!r} given but LoRA is not "
                             "enabled (pass enable_lora=True / --enable-lora)")
        return self.lora.load(lora_request)

    def abort_request(self, request_ids: str | Sequence[str]) -> None:
        """Finish the requests as aborted and free their blocks (unknown ids are ignored)."""
        unfinished = []
        for rid in [request_ids] if isinstance(request_ids, str) else request_ids:
            seqs = self._requests.pop(rid, None)
            if seqs is None:
                continue
            unfinished.extend(seq for seq in seqs if not seq.is_finished)
            self.output_processor.groups.pop(rid, None)
            self.stats.on_finish("abort")
        self.scheduler.finish_requests(unfinished, RequestStatus.FINISHED_ABORTED)
        self._update_gauges()

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

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
        if self.faults is not None:
            self.faults.on_schedule([s.request.group_id for s in sched.scheduled])
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
        if self.spec is not None:
            self.scheduler.set_draft_tokens(
                self.spec.propose(result, self.scheduler.running, self.block_manager))
        outputs = []
        for gid in processed.touched:
            if final_only and not self.output_processor.groups[gid].finished:
                continue
            outputs.append(self._output(gid, kind))
        t3 = time.perf_counter()
        self.stats.on_step(sched, result, update.num_tokens, self.block_manager.usage,
                           len(self.scheduler.running), len(self.scheduler.waiting),
                           {"schedule": (t1 - t0) * 1e3, **result.timings_ms,
                            "output": (t3 - t2) * 1e3}, swapped=len(self.scheduler.swapped))
        self._update_gauges()
        if self.debug_steps:
            logger.info(self.stats.step_line())
        return outputs

    def _output(self, group_id: str, kind: RequestOutputKind) -> RequestOutput:
        """The group's output; a finished group leaves the engine (a group whose output
        could not be built is finished with an error: its sequences are aborted)."""
        out = self.output_processor.make_output(group_id, kind=kind)
        if out.finished:
            seqs = self._requests.pop(group_id, [])
            self.scheduler.finish_requests([s for s in seqs if not s.is_finished],
                                           RequestStatus.FINISHED_ABORTED)
            self.stats.on_finish("error" if out.error is not None
                                 else out.outputs[0].finish_reason or "abort")
        return out

    def check_health(self) -> None:
        """Raise WorkerDied if a tensor-parallel worker is gone (the server polls it)."""
        if self.executor is not None:
            self.executor.check_health()

    def shutdown(self) -> None:
        """Stop the tensor-parallel workers (nothing to do for one process)."""
        if self.executor is not None:
            self.executor.shutdown()

    def _update_gauges(self) -> None:
        self.stats.observe_queues(self.scheduler, self.block_manager)

    def check_idle(self) -> None:
        """With no request left: block accounting intact and no KV block in use (raises
        BlockInvariantError / RuntimeError otherwise); the server runs it whenever it idles."""
        self.check_invariants()
        if self.block_manager.usage != 0:
            raise RuntimeError(f"idle engine holds KV blocks (usage "
                               f"{self.block_manager.usage:.3f})")

    def check_invariants(self) -> None:
        live = [s for seqs in self._requests.values() for s in seqs]
        self.block_manager.check_invariants(live)
        if self.swap_manager is not None:
            self.swap_manager.check_invariants(live)
