"""Typed engine configuration, validated at construction.

Derived numbers (KV bytes per token, number of blocks) are computed once, here, so the
start-up log, the CLI and the engine agree.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import torch

from pagedllm.config import dtype as dtypes
from pagedllm.config.dtype import DTYPES, resolve_dtype  # noqa: F401 - re-exported
from pagedllm.config.generation import validate_generation_config
from pagedllm.config.pooler import PoolerConfig, validate_runner
from pagedllm.config.speculative import SpeculativeConfig
from pagedllm.config.vocabulary import (
    DISTRIBUTED_BACKENDS,
    PREEMPTION_MODES,
    QUANTIZATION_METHODS,
    SCHEDULING_POLICIES,
)
from pagedllm.config.vocabulary import KV_CACHE_DTYPES as KV_CACHE_DTYPE_NAMES
from pagedllm.kernels import cpu_features
from pagedllm.lora.config import LoRAConfig
from pagedllm.model.layers.rope_scaling import parse_rope_scaling
from pagedllm.sampling_params import MAX_LOGPROBS

logger = logging.getLogger(__name__)

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9,
          "T": 1e12, "TB": 1e12, "KI": 2**10, "KIB": 2**10, "MI": 2**20, "MIB": 2**20,
          "GI": 2**30, "GIB": 2**30, "TI": 2**40, "TIB": 2**40}

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
KV_CACHE_DTYPES = {name: getattr(torch, attr) for name, attr in KV_CACHE_DTYPE_NAMES.items()}


def parse_size(value: int | float | str) -> int:
    """Parse a byte count: 2147483648, '2GiB', '512MiB', '1.5G' (decimal G = 1e9)."""
    if isinstance(value, int | float):
        return int(value)
    m = _SIZE_RE.match(value)
    if not m:
        raise ValueError(f"cannot parse memory size {value!r}; use bytes or a suffix like 4GiB")
    unit = (m.group(2) or "").upper()
    if unit not in _UNITS:
        raise ValueError(f"unknown memory unit in {value!r}")
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass
class EngineConfig:
    """Every knob of the engine (vLLM names). `finalize()` fills model-dependent values."""

    model: str | None = None
    dtype: str | torch.dtype = "auto"
    device: str = "auto"
    block_size: int = 16
    kv_cache_memory: int | str | None = None  # bytes; default 2 GiB on CPU
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    seed: int = 0
    num_threads: int | None = None
    rope_scaling: dict | None = None  # replaces the model's rope scaling (HF keys, or JSON text)
    rope_theta: float | None = None   # replaces the model's RoPE base
    allow_long_max_model_len: bool = False  # max_model_len past the model's RoPE maximum
    enable_prefix_caching: bool = True  # share full KV blocks of common prompt prefixes
    # auto: the model dtype (float16 on the int8-activation path, `resolve_kv_cache_dtype`),
    # float32, float16, int8, fp8 (= fp8_e4m3), fp8_e5m2
    kv_cache_dtype: str = "auto"
    preemption_mode: str = "recompute"  # or "swap": preempted blocks go to CPU swap space
    # "fcfs" (arrival order) or "priority": waiting requests by (priority, arrival), lower
    # first; the preemption victim is the lowest-priority, latest-arrived running request.
    scheduling_policy: str = "fcfs"
    swap_space: float = 4.0  # GiB of CPU memory for swapped blocks (swap mode; 0 disables)
    chat_template: str | None = None  # Jinja text or a file; replaces the model's template
    revision: str | None = None       # Hub models: branch, tag or commit (default main)
    tokenizer: str | None = None      # directory or Hub name of another tokenizer
    download_dir: str | None = None   # HF cache for Hub models (default: $HF_HUB_CACHE ...)
    generation_config: str = "auto"  # sampling defaults: auto (model's file), vllm, or a folder
    quantization: str | None = None  # QUANTIZATION_METHODS; None = detect from the checkpoint
    enable_lora: bool = False  # serve PEFT LoRA adapters per request (pagedllm/lora/)
    max_loras: int = 1  # adapters in one batch (device slots)
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # adapters cached in CPU memory (default: max_loras)
    # with quantization="int8": W8A8 (dynamic int8 x, a scale per 32 values); a GGUF model:
    # its int8-activation kernels (model/layers/quant/gguf_a8_panels.py). None = auto: on where the
    # CPU kernels' int8 dot products are SIMD (kernels/cpu_features.py), resolved by
    # `resolve_int8_activations` once the checkpoint's kind is known; False = exact path.
    int8_activations: bool | None = None
    max_logprobs: int = MAX_LOGPROBS  # largest `logprobs` / `top_logprobs` a request may ask for (vLLM)
    enforce_eager: bool = False  # no CUDA graphs for decode steps (worker/cuda_graphs.py)
    tensor_parallel_size: int = 1  # ranks each holding 1/N of every layer (distributed/)
    # MoE experts under TP (distributed/expert_sharding.py): True = whole experts per rank
    # (E/N each; vLLM's flag), False = 1/N of every expert's width, None = auto: whole
    # experts when N divides E (measured faster: benchmarks/moe_parallel.py)
    enable_expert_parallel: bool | None = None
    data_parallel_size: int = 1    # engine replicas behind one API server (data_parallel/)
    distributed_executor_backend: str | None = None  # "mp" | "ray"; None = mp
    # Speculative decoding (speculative/): a SpeculativeConfig, its dict or JSON text.
    speculative_config: SpeculativeConfig | dict | str | None = None
    # Decode steps one engine step may run in one call to the model (vLLM's name): CPU,
    # Llama-family and Gemma 3 models in the C++ layer loop, batches of greedy decodes with
    # nothing waiting (core/multi_step.py, model/decode_steps.py); 1 = one step at a time. Fewer for
    # larger batches (k x rows <= 32): a request arriving meanwhile waits up to k - 1 steps.
    num_scheduler_steps: int = 8
    # Keep sliding-window layers' KV for the whole sequence, like full attention (vLLM's
    # flag): no per-group block tables, no freeing of blocks that leave the window.
    disable_hybrid_kv_cache_manager: bool = False
    # Pooling (config/pooler.py, pagedllm/pooling/): generate or pool, the conversion of a
    # decoder checkpoint, and the pooler (a PoolerConfig, its dict or JSON text).
    runner: str = "auto"
    convert: str = "auto"
    pooler_config: PoolerConfig | dict | str | None = None

    def __post_init__(self) -> None:
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.torch_device = torch.device(self.device)
        # compute dtype (activations, norms, attention, 'auto' KV cache) and the matrices'
        # (linear weights, embedding table; None: 'auto' on CPU, settled by
        # `resolve_linear_dtype`); they differ for bf16 on CPU: bf16 matrices, fp32 compute
        # (config/dtype.py)
        self.torch_dtype = resolve_dtype(self.dtype, self.torch_device)
        self.linear_dtype = dtypes.linear_dtype(self.dtype, self.torch_device)
        if self.kv_cache_dtype != "auto" and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of auto, {', '.join(KV_CACHE_DTYPES)}; "
                             f"got {self.kv_cache_dtype!r}")
        self.torch_kv_cache_dtype = KV_CACHE_DTYPES.get(self.kv_cache_dtype, self.torch_dtype)
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.kv_cache_memory is not None:
            self.kv_cache_memory = parse_size(self.kv_cache_memory)
            if self.kv_cache_memory <= 0:
                raise ValueError(f"kv_cache_memory must be > 0, got {self.kv_cache_memory}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(
                f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}"
                             f"; got {self.scheduling_policy!r}")
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {', '.join(PREEMPTION_MODES)}; "
                             f"got {self.preemption_mode!r}")
        if not self.swap_space >= 0:
            raise ValueError(f"swap_space must be >= 0 (GiB), got {self.swap_space}")
        if self.quantization is not None and self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_METHODS)} "
                             f"(or None to detect it from the checkpoint); "
                             f"got {self.quantization!r}")
        if self.int8_activations and self.quantization not in ("int8", "gguf", None):
            raise ValueError("int8_activations needs quantization='int8' (W8A8) or a GGUF "
                             f"model kept quantized ('gguf' or None), got {self.quantization!r}")
        if not (isinstance(self.max_logprobs, int) and self.max_logprobs >= 0):
            raise ValueError(f"max_logprobs must be an int >= 0, got {self.max_logprobs!r}")
        for name in ("tensor_parallel_size", "data_parallel_size", "num_scheduler_steps"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.enable_expert_parallel not in (None, True, False):
            raise ValueError(f"enable_expert_parallel must be True, False or None (auto), got "
                             f"{self.enable_expert_parallel!r}")
        if self.distributed_executor_backend not in DISTRIBUTED_BACKENDS:
            raise ValueError(f"distributed_executor_backend must be one of mp, ray (or None "
                             f"for mp), got {self.distributed_executor_backend!r}")
        self.rope_scaling = parse_rope_scaling(self.rope_scaling)
        self.speculative_config = SpeculativeConfig.parse(self.speculative_config)
        validate_runner(self.runner, self.convert)
        self.pooler_config = PoolerConfig.parse(self.pooler_config)
        if (self.speculative_config is not None and self.preemption_mode == "swap"
                and self.speculative_config.method == "draft_model"):
            raise ValueError("speculative method draft_model does not support "
                             "preemption_mode='swap' (the draft's KV pool has no swap space); "
                             "use preemption_mode='recompute'")
        self.lora_config = (LoRAConfig(self.max_loras, self.max_lora_rank, self.max_cpu_loras)
                            if self.enable_lora else None)
        validate_generation_config(self.generation_config)
        if self.rope_theta is not None and not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")

    def resolve_int8_activations(self, gguf: bool, block_quantized: bool = True) -> None:
        """Settle int8_activations=None (auto) for a GGUF (`gguf`) or float checkpoint: on
        where it applies (a GGUF model kept quantized, or --quantization int8) on a CPU whose
        kernels have fast int8 dot products; off everywhere else. Then the KV dtype 'auto'
        (`resolve_kv_cache_dtype`); `block_quantized`: whether the GGUF's matrices are in
        block formats (an all-float GGUF runs exact matrices whatever the flag says)."""
        if self.int8_activations is None:
            applies = (self.quantization == "int8"
                       or (gguf and self.quantization in (None, "gguf")))
            self.int8_activations = (applies and self.torch_device.type == "cpu"
                                     and cpu_features.default_int8_activations())
        self.resolve_kv_cache_dtype(bool(self.int8_activations) and (
            self.quantization == "int8" or (gguf and block_quantized)))

    def resolve_kv_cache_dtype(self, int8_matrices: bool) -> None:
        """kv_cache_dtype='auto' settled: float16 K / V under fp32 compute on CPU where the
        matrices run int8 activations (`int8_matrices`: the fast path, already not
        bit-exact; llama.cpp's default f16 cache; half the bytes a decode step's attention
        reads; docs/benchmarks.md measures both), else the model dtype. 'float32' keeps fp32
        K / V on that path."""
        if (self.kv_cache_dtype == "auto" and int8_matrices
                and self.torch_device.type == "cpu" and self.torch_dtype == torch.float32):
            self.torch_kv_cache_dtype = torch.float16
            logger.info("kv_cache_dtype auto: float16 (int8 activations; --kv-cache-dtype "
                        "float32 for fp32 K/V)")

    def resolve_linear_dtype(self, float_weights: bool, checkpoint_dtype: object = None) -> None:
        """Settle linear_dtype=None ('auto' on CPU) once the checkpoint is known: bf16 where
        `dtype.auto_linear_dtype` allows it (the CPU, the weights being float, the saved
        dtype), else float32; logged with the reason."""
        if self.linear_dtype is not None:
            return
        self.linear_dtype, why = dtypes.auto_linear_dtype(float_weights, checkpoint_dtype)
        logger.info("dtype auto: %s linear weights, float32 activations (%s)",
                    str(self.linear_dtype).removeprefix("torch."), why)

    @property
    def bf16_linear_weights(self) -> bool:
        """Linear weights in bf16 under fp32 compute (CPU): model/layers/quant/bf16.py."""
        return self.linear_dtype == torch.bfloat16 and self.torch_dtype == torch.float32

    def finalize(self, model_max_len: int, derivation: str = "") -> None:
        """Resolve defaults that depend on the model's context length (`rope_max_len`)."""
        if self.max_model_len is None:
            self.max_model_len = model_max_len
        elif self.max_model_len > model_max_len:
            why = f" ({derivation})" if derivation else ""
            msg = (f"max_model_len={self.max_model_len} exceeds the model's maximum context "
                   f"length {model_max_len}{why}")
            if not self.allow_long_max_model_len:
                raise ValueError(
                    f"{msg}. Positions past it were never trained: configure rope scaling "
                    f"that covers {self.max_model_len} tokens (e.g. --rope-scaling "
                    f"'{{\"rope_type\": \"yarn\", \"factor\": 4.0}}' for 4x the original "
                    f"length), or pass --allow-long-max-model-len "
                    f"(allow_long_max_model_len=True) to run anyway, at the risk of degraded "
                    f"output")
            logger.warning("%s; allowed by allow_long_max_model_len, output quality past "
                           "%d tokens may degrade", msg, model_max_len)
        if self.max_num_batched_tokens is None:
            self.max_num_batched_tokens = 2048
