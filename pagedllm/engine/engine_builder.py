"""Start-up of an engine: `EngineConfig` -> every part `LLMEngine` steps with.

    checkpoint (tokenizer, HF config)      open_checkpoint (worker/rank_builder + serving bits)
    TP ranks 1..N-1 start loading          distributed/executor.start_tensor_parallel
    this rank's model, KV spec, backend    rank_builder.build_rank
    cross-feature decisions                plan.resolve_plan (logged once)
    KV budget -> blocks                    model_setup (+ plan.split_kv_budget for a draft)
    KV pool, block manager, scheduler      worker/cache_engine, core/
    LoRA, structured output, proposer      their own packages, constructed with what they need
    runner, output processor, stats        worker/model_runner, engine/

Each part is constructed with its collaborators; nothing is wired in afterwards.
"""

from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass

import torch
from torch import nn

from pagedllm import startup
from pagedllm.config import EngineConfig, KVCacheSpec
from pagedllm.config.generation import sampling_defaults
from pagedllm.core.block_manager import BlockManager
from pagedllm.core.scheduler import Scheduler
from pagedllm.core.swap_manager import SwapManager
from pagedllm.distributed.executor import (
    TPExecutor,
    check_tensor_parallel,
    start_tensor_parallel,
    weight_format_before_loading,
)
from pagedllm.distributed.worker import rank_threads
from pagedllm.engine.chat_template import resolve_chat_template
from pagedllm.engine.intake import RequestIntake
from pagedllm.engine.output_processor import OutputProcessor
from pagedllm.engine.plan import EnginePlan, resolve_plan, split_kv_budget
from pagedllm.engine.stats import EngineStats
from pagedllm.loader import Checkpoint
from pagedllm.lora.manager import LoRAManager
from pagedllm.model.decode_steps import DecodeSteps
from pagedllm.pooling.setup import PoolingSetup, resolve_pooling
from pagedllm.pooling.step_pooler import StepPooler
from pagedllm.speculative.speculator import Speculator
from pagedllm.structured_output.manager import StructuredOutputManager
from pagedllm.worker import cuda_graphs, gpu_memory, model_setup
from pagedllm.worker.cache_engine import CacheEngine
from pagedllm.worker.model_runner import ModelRunner
from pagedllm.worker.rank_builder import build_rank, prepare_checkpoint

logger = logging.getLogger(__name__)


@dataclass
class EngineParts:
    """Everything one engine runs with, built once by `build_engine`."""

    tokenizer: object
    hf_config: object
    model_name: str
    sampling_defaults: dict
    vocab_size: int
    eos_token_id: int | None
    plan: EnginePlan
    model: nn.Module
    kv_spec: KVCacheSpec
    num_blocks: int
    num_swap_blocks: int
    cache: CacheEngine
    block_manager: BlockManager
    swap_manager: SwapManager | None
    scheduler: Scheduler
    lora: LoRAManager | None
    structured_output: StructuredOutputManager
    speculator: Speculator | None
    executor: TPExecutor | None
    runner: ModelRunner
    output_processor: OutputProcessor
    intake: RequestIntake
    stats: EngineStats
    pooling: PoolingSetup | None  # --runner pooling: what the model pools (else None)


def eos_token_id_of(ckpt: Checkpoint) -> int | None:
    """The EOS every request stops at (and beam search finishes on): the model config's
    (the first of a list), else the tokenizer's."""
    eos = getattr(ckpt.config, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) else eos
    return eos if eos is not None else ckpt.tokenizer.eos_token_id


def open_checkpoint(config: EngineConfig) -> tuple[Checkpoint, str, dict]:
    """The checkpoint of `config.model` as every engine front sees it (LLMEngine, the DP
    front): --chat-template applied to its tokenizer, RoPE overrides applied to its config,
    the context-length defaults resolved. Also the served model name and the SamplingParams
    defaults from generation_config.json (vLLM's --generation-config)."""
    ckpt = prepare_checkpoint(config)
    if config.chat_template is not None:
        ckpt.tokenizer.chat_template = resolve_chat_template(config.chat_template)
    name = str(config.model) if config.model else "SmolLM2-135M-Instruct"
    defaults = sampling_defaults(config.generation_config,
                                 ckpt.source if ckpt.source.is_dir() else None)
    return ckpt, name, defaults


def build_engine(config: EngineConfig, owner: object) -> EngineParts:
    """Build the parts of an engine for `config`. `owner` is the object whose lifetime the
    tensor-parallel workers follow (they are shut down when it is collected)."""
    if config.tensor_parallel_size > 1:  # refused before anything loads (LLM() as the CLI)
        check_tensor_parallel(config, weight_format_before_loading(config))
    if config.num_threads or config.tensor_parallel_size > 1:
        torch.set_num_threads(rank_threads(config))
    with startup.step("checkpoint (config, tokenizer)"):
        ckpt, model_name, defaults = open_checkpoint(config)
    hf, tokenizer = ckpt.config, ckpt.tokenizer
    pooling = resolve_pooling(config, hf)  # --runner / --convert refused before loading
    executor = start_tensor_parallel(config, ckpt)  # ranks 1..N-1 load while this one does
    if executor is not None:  # also when the rest of start-up raises
        weakref.finalize(owner, executor.shutdown)
    rank = build_rank(config, ckpt, tp=executor.shard if executor is not None else None)
    plan = resolve_plan(config, hf, rank.kv_spec.groups, pooling)
    eos = eos_token_id_of(ckpt)
    lora = (LoRAManager(rank.model, config.lora_config, config.torch_device, config.torch_dtype)
            if config.lora_config else None)
    speculator = None
    if config.speculative_config is not None:
        with startup.step(f"speculative decoding ({config.speculative_config.method})"):
            speculator = Speculator(config.speculative_config, config, hf.vocab_size)
    budget = model_setup.kv_budget_bytes(config, _gpu_peak(config, rank, hf.vocab_size))
    draft_kv = speculator.draft_kv_spec if speculator is not None else None
    budget = split_kv_budget(budget, rank.plan_kv_spec.bytes_per_block,
                             draft_kv.bytes_per_block if draft_kv is not None else None)
    num_blocks = model_setup.plan_num_blocks(rank.plan_kv_spec, budget, config.max_model_len,
                                             model_dtype=config.torch_dtype,
                                             chunk=config.max_num_batched_tokens)
    num_swap = model_setup.plan_swap_blocks(rank.plan_kv_spec, config)
    if executor is not None:
        executor.start(num_blocks, num_swap)
    with startup.step(f"KV pool {num_blocks * rank.kv_spec.bytes_per_block / 2**30:.2f} GiB"):
        cache = CacheEngine(rank.kv_spec, num_blocks, config.torch_device,
                            num_swap_blocks=num_swap)
    bm = BlockManager(num_blocks, config.block_size, enable_caching=plan.prefix_caching,
                      layout=rank.kv_spec.groups)
    swap = SwapManager(num_swap, bm) if config.preemption_mode == "swap" else None
    steps = _decode_steps(config, rank.model, hf.vocab_size,
                          plain=executor is None and speculator is None and pooling is None
                          and lora is None and rank.attention_backend.runs_fused_decode)
    scheduler = Scheduler(bm, max_num_seqs=config.max_num_seqs,
                          max_num_batched_tokens=config.max_num_batched_tokens,
                          max_model_len=config.max_model_len, swap_manager=swap,
                          max_loras=config.max_loras if lora else None,
                          policy=config.scheduling_policy,
                          max_steps=config.num_scheduler_steps if steps is not None else 1)
    structured = StructuredOutputManager(tokenizer, hf.vocab_size, eos)
    draft = speculator.draft if speculator is not None else None
    if draft is not None:
        draft.allocate(num_blocks)
    graphs = None
    if plan.cuda_graphs:
        with startup.step("CUDA graphs"):
            graphs = cuda_graphs.for_engine(rank, cache, config, lora is not None)
    runner = ModelRunner(rank.model, cache, rank.attention_backend, vocab_size=hf.vocab_size,
                         device=config.torch_device,
                         seed=config.seed, lora=lora, structured_output=structured,
                         tp_executor=executor, draft=draft, graphs=graphs,
                         pooler=_pooler(pooling, rank.model), decode_steps=steps)
    stats = EngineStats(max_lora=config.max_loras if lora else 0,
                        speculative=speculator.new_stats() if speculator else None)
    return EngineParts(
        tokenizer=tokenizer, hf_config=hf, model_name=model_name, sampling_defaults=defaults,
        vocab_size=hf.vocab_size, eos_token_id=eos, plan=plan, model=rank.model,
        kv_spec=rank.kv_spec, num_blocks=num_blocks, num_swap_blocks=num_swap, cache=cache,
        block_manager=bm, swap_manager=swap, scheduler=scheduler, lora=lora,
        structured_output=structured, speculator=speculator, executor=executor,
        runner=runner, output_processor=OutputProcessor(tokenizer, pooling), stats=stats,
        intake=RequestIntake(config, tokenizer, hf.vocab_size, eos, lora, structured, pooling),
        pooling=pooling)


def _decode_steps(config: EngineConfig, model: nn.Module, vocab_size: int, plain: bool
                  ) -> DecodeSteps | None:
    """The runner's multi-step decode (model/decode_steps.py) when --num-scheduler-steps
    asks for more than one and it can run (`plain`: one rank, no speculative decoding, LoRA or
    pooling, the C++ attention backend): on the CPU, a model it fits (logged when not)."""
    if config.num_scheduler_steps <= 1:
        return None
    steps = (DecodeSteps.build(model, vocab_size)
             if plain and config.torch_device.type == "cpu" else None)
    if steps is None:
        logger.info("num_scheduler_steps=%d: one decode step at a time here (multi-step decode "
                    "needs the CPU with its C++ attention, one rank, no speculative decoding, "
                    "LoRA or pooling, and a Llama-family or Gemma 3 model in the C++ decode loop)",
                    config.num_scheduler_steps)
    else:
        logger.info("up to %d decode steps per engine step (batches of greedy decodes)",
                    config.num_scheduler_steps)
    return steps


def _pooler(pooling: PoolingSetup | None, model: nn.Module) -> StepPooler | None:
    """The runner's pooling hook (a classifier's score head applied to each pooled part)."""
    if pooling is None:
        return None
    return StepPooler(pooling.pooling_type,  # num_labels: the checkpoint's score head is used
                      model.score if pooling.num_labels else None)


def _gpu_peak(config: EngineConfig, rank, vocab_size: int) -> int | None:
    """On CUDA without --kv-cache-memory: weights + profiled activation peak + memory
    outside torch (worker/gpu_memory.py); the budget is utilization x total minus it."""
    if config.torch_device.type != "cuda" or config.kv_cache_memory is not None:
        return None
    peak = gpu_memory.profile(rank.model, rank.kv_spec, config, vocab_size,
                              rank.attention_backend)
    return peak.weights + peak.activation_peak + peak.non_torch
