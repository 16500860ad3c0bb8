"""Build the model from a checkpoint and size the KV pool from the memory budget."""

from __future__ import annotations

import dataclasses
import logging
import time

import torch
from torch import nn

from pagedllm.config import EngineConfig, KVCacheSpec
from pagedllm.core.kv_groups import KVGroupLayout
from pagedllm.errors import ModelLoadError
from pagedllm.kernels import cpu_features
from pagedllm.loader import Checkpoint
from pagedllm.loader.default_model import resolve_model
from pagedllm.loader.gguf_reader import block_quantized, open_gguf
from pagedllm.model.layers import kv_quant
from pagedllm.model.layers.mla import latent_kv_dims
from pagedllm.model.layers.parallel import tensor_parallel_layers
from pagedllm.model.layers.quant import hf_checkpoint, prompt_tile_weights
from pagedllm.model.layers.quant.dense import linear_weights
from pagedllm.model.models.llama import model_dims
from pagedllm.model.registry import get_model_class
from pagedllm.worker import weight_arena

logger = logging.getLogger(__name__)

DEFAULT_CPU_KV_BYTES = 2 * 2**30
GiB = 2**30


def resolve_int8_activations(config: EngineConfig) -> None:
    """int8_activations=None (auto) settled for the model `config` names (a GGUF file or
    not), before anything is loaded: every rank and front calls this with the same answer."""
    path = resolve_model(config.model, config.revision, config.download_dir)
    gguf = path.is_file()
    config.resolve_int8_activations(gguf=gguf, block_quantized=gguf and block_quantized(
        open_gguf(path, vocabulary=False)))


def resolve_linear_dtype(ckpt: Checkpoint, config: EngineConfig) -> None:
    """linear_dtype=None ('auto' on CPU) settled for this checkpoint (`settle_linear_dtype`)."""
    settle_linear_dtype(config, ckpt.quantization, ckpt.config)


def settle_linear_dtype(config: EngineConfig, held: str, model_config) -> None:
    """linear_dtype=None ('auto' on CPU) settled for a checkpoint holding `held` weights
    ("none": float) and saved in `model_config`'s dtype (config/dtype.py); shared by the
    engine's start-up and `pagedllm plan`, which has only the config."""
    config.resolve_linear_dtype(float_weights(held, config.quantization),
                                getattr(model_config, "dtype", None)
                                or getattr(model_config, "torch_dtype", None))


def float_weights(held: str, asked: str | None) -> bool:
    """The linear weights are float once loaded: `asked` (--quantization) is "none" (GGUF,
    AWQ, GPTQ dequantized), or nothing is asked and the checkpoint `held` is float."""
    return asked == "none" or (asked is None and held == "none")


def bf16_linear_held(config: EngineConfig, held: str) -> bool:
    """Whether the settled config holds a checkpoint of `held` weights as bf16 matrices under
    fp32 compute (only float weights become bf16; quantized ones stay as they are)."""
    return config.bf16_linear_weights and float_weights(held, config.quantization)


def weight_format(ckpt: Checkpoint, config: EngineConfig) -> str:
    """The format the weights are held in once loaded (for the start-up log): int8 made at
    load (W8A8 with int8 activations), bf16 linear weights under fp32, else what the
    checkpoint yields."""
    if config.quantization == "int8":
        return "int8 (W8A8)" if config.int8_activations else "int8"
    if bf16_linear_held(config, ckpt.quantization):
        return "bf16 linear layers and embeddings, float32 norms"
    return ckpt.quantization


def build_model(ckpt: Checkpoint, config: EngineConfig, tp=None) -> nn.Module:
    """Construct on the meta device, allocate once on the target device, copy weights in.

    `tp` = (TPLayout, TPGroup) under tensor parallelism: the model is built with this rank's
    head / width / vocab counts and loads only its shard (pagedllm/distributed/sharding.py).
    """
    t0 = time.perf_counter()
    cls = get_model_class(getattr(ckpt.config, "architectures", None))
    model_config = ckpt.config if tp is None else tp[0].model_config(ckpt.config)
    collectives = None if tp is None else tp[0].collectives(tp[1])
    with (torch.device("meta"), tensor_parallel_layers(collectives),
          linear_weights(config.linear_dtype)):
        model = cls(model_config)
    model = model.to_empty(device=config.torch_device).to(config.torch_dtype)
    n_params = sum(p.numel() for p in model.parameters())
    if getattr(model, "tie_word_embeddings", False):  # (a classifier has no lm_head)
        n_params -= model.lm_head.weight.numel()
    weights = hf_checkpoint.prepare_weights(ckpt, config, unbuilt=tp is not None)
    if tp is not None:
        weights = tp[0].shard_weights(weights)
    model.load_weights(weights)
    model.eval()
    if (tp is None and config.torch_device.type == "cpu"
            and cpu_features.prompt_matrix_tiles_on()):
        prompt_tile_weights.keep_tiles(model)  # one rank: its prompt rows run on the tiles
    if config.torch_device.type == "cpu":
        weight_arena.into_huge_pages(model)  # the kept tiles too
    logger.info("loaded %s (%s, %.1fM parameters, %s on %s, weights %s) in %.1f s: "
                "%.1f MiB of weights resident", ckpt.source.name, cls.__name__, n_params / 1e6,
                config.torch_dtype, config.torch_device, weight_format(ckpt, config),
                time.perf_counter() - t0, weight_bytes(model) / 2**20)
    return model


def weight_bytes(model: nn.Module) -> int:
    """Bytes the model's weights really occupy: parameters and packed layouts, quantized
    weights at their packed size; storage shared by two layers (a tied lm_head) counted once."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        quant = getattr(module, "quant", None)
        if quant is not None and id(quant) not in seen:
            seen.add(id(quant))
            total += quant.nbytes
        tensors = [*module.parameters(recurse=False), *module.buffers(recurse=False),
                   getattr(module, "packed", None), getattr(module, "weight_t", None)]
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.numel() and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


def layer_windows(hf_config) -> list[int | None]:
    """Each layer's sliding window (None: full attention), as the model applies them:
    per layer for models that say so (the class's `layer_windows(config)`, Qwen2-MoE; Gemma 3's
    `layer_types`), else the config's one window on every layer (Mistral), else none."""
    n = hf_config.num_hidden_layers
    window = getattr(hf_config, "sliding_window", None)
    if not window or not getattr(hf_config, "use_sliding_window", True):
        return [None] * n
    try:
        cls = get_model_class(getattr(hf_config, "architectures", None))
    except ValueError:
        cls = None
    if getattr(cls, "per_layer_sliding_window", False):
        if hasattr(cls, "layer_windows"):
            return cls.layer_windows(hf_config)
        from pagedllm.model.models.gemma3 import SLIDING, layer_types

        return [window if t == SLIDING else None for t in layer_types(hf_config)]
    return _uniform_window(hf_config, window)


def _uniform_window(hf_config, window: int) -> list[int | None]:
    """The one window of a model whose attention applies the same window to every layer.
    A config whose `layer_types` marks only some layers sliding (HF's Qwen2 / Qwen3: the
    layers from `max_window_layers` on) cannot run on it: refused, rather than sliding the
    full layers too. None of them sliding: no window."""
    n = hf_config.num_hidden_layers
    types = getattr(hf_config, "layer_types", None)
    if types is None or len(types) != n:
        return [window] * n
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if sliding and len(sliding) < n:
        raise ModelLoadError(
            f"{getattr(hf_config, 'model_type', 'this model')}: a sliding window "
            f"(use_sliding_window) on layers {sliding} only (of {n}; layer_types / "
            f"max_window_layers) is not supported; this model applies one window to all layers "
            f"or none")
    return [window if sliding else None] * n


def single_kv_group(config: EngineConfig) -> bool:
    """Every layer in one KV group (sliding layers keep all their blocks): asked for with
    --disable-hybrid-kv-cache-manager, and always under tensor parallelism, whose ranks
    rebuild the batch from rank 0's arrays, which carry one block table."""
    return config.disable_hybrid_kv_cache_manager or config.tensor_parallel_size > 1


def kv_layout(config: EngineConfig, windows: list[int | None]) -> KVGroupLayout:
    """The KV group layout of a model whose layers have these sliding windows."""
    if single_kv_group(config):
        return KVGroupLayout.one_table(windows)
    return KVGroupLayout.from_windows(windows)


def kv_spec_for(hf_config, config: EngineConfig) -> KVCacheSpec:
    """The KV cache's shape; its group layout frees sliding layers' out-of-window blocks
    unless `disable_hybrid_kv_cache_manager` (then every layer keeps all its KV). A
    multi-head latent attention model caches one latent row per token (one part, one head)."""
    _, kv_heads, head_dim = model_dims(hf_config)
    parts = 2
    if (latent := latent_kv_dims(hf_config)) is not None:
        (kv_heads, head_dim), parts = latent, 1
        if kv_quant.is_quantized(config.torch_kv_cache_dtype):
            raise ValueError(f"kv_cache_dtype {config.kv_cache_dtype!r} is not supported with "
                             f"{hf_config.model_type}'s latent KV cache; use auto")
    return KVCacheSpec(num_layers=hf_config.num_hidden_layers, num_kv_heads=kv_heads, head_dim=head_dim,
                       dtype=config.torch_kv_cache_dtype, block_size=config.block_size,
                       layout=kv_layout(config, layer_windows(hf_config)), parts=parts)


def kv_budget_bytes(config: EngineConfig, profile_peak_bytes: int | None = None) -> int:
    """Bytes for the KV pool: explicit `kv_cache_memory`, else on CUDA the share of device
    memory left by `gpu_memory_utilization` after the profiled peak, else 2 GiB on CPU."""
    if config.kv_cache_memory is not None:
        return int(config.kv_cache_memory)
    if config.torch_device.type == "cuda":
        total = torch.cuda.get_device_properties(config.torch_device).total_memory
        peak = profile_peak_bytes or torch.cuda.max_memory_allocated(config.torch_device)
        budget = int(total * config.gpu_memory_utilization) - peak
        if budget <= 0:
            raise ValueError(
                f"no memory left for the KV cache: model + activations peak at {peak / GiB:.2f} "
                f"GiB of {total / GiB:.2f} GiB; raise gpu_memory_utilization "
                f"(now {config.gpu_memory_utilization})")
        return budget
    return DEFAULT_CPU_KV_BYTES


def plan_num_blocks(spec: KVCacheSpec, budget: int, max_model_len: int,
                    model_dtype: torch.dtype | None = None, chunk: int = 1) -> int:
    """Blocks that fit in `budget`; refuses a pool that cannot hold one max_model_len sequence
    (computing `chunk` tokens a step).

    With an int8 / fp8 cache and `model_dtype` given, the log also compares the capacity with
    an unquantized cache of the model dtype.
    """
    num_blocks = spec.num_blocks_for(budget)
    usable = num_blocks - (1 if spec.groups.frees_blocks else 0)  # NULL_BLOCK
    per_seq = spec.blocks_per_seq(max_model_len, min(chunk, max_model_len))
    dtype_name = str(spec.dtype).removeprefix("torch.")
    scale_term = f" + {spec.scale_bytes} scale bytes" if spec.quantized else ""
    vs_model = ""
    if spec.quantized and model_dtype is not None:
        plain = dataclasses.replace(spec, dtype=model_dtype)
        vs_model = (f" ({plain.bytes_per_token / spec.bytes_per_token:.2f}x the tokens of a "
                    f"{str(model_dtype).removeprefix('torch.')} cache)")
    logger.info(
        "KV cache (%s): %d bytes/token (%d x %d layers x %d kv_heads x (%d head_dim x %d bytes%s)); "
        "budget %.2f GiB -> %d blocks of %d tokens = %d tokens%s; %.1f sequences of "
        "max_model_len %d fit", dtype_name, spec.bytes_per_token, spec.parts, spec.num_layers,
        spec.num_kv_heads, spec.head_dim, spec.dtype_bytes, scale_term, budget / GiB,
        num_blocks, spec.block_size, num_blocks * spec.block_size, vs_model,
        num_blocks / per_seq, max_model_len)
    if spec.parts == 1:
        logger.info("KV cache is multi-head latent attention's latent cache: %d bytes/token = "
                    "%d layers x %d latent values (kv_lora_rank + qk_rope_head_dim) x %d "
                    "bytes, one row shared by every head", spec.bytes_per_token,
                    spec.num_layers, spec.head_dim, spec.dtype_bytes)
    log_groups(spec, max_model_len)
    if usable < per_seq:
        need = per_seq * spec.bytes_per_block
        raise ValueError(
            f"the KV cache budget of {budget / GiB:.3f} GiB holds {num_blocks} blocks "
            f"({num_blocks * spec.block_size} tokens), less than one sequence of max_model_len "
            f"{max_model_len} ({per_seq} blocks); raise kv_cache_memory to at least "
            f"{need / GiB:.3f} GiB ({need} bytes) or lower max_model_len to "
            f"{num_blocks * spec.block_size}")
    return num_blocks


def log_groups(spec: KVCacheSpec, max_model_len: int) -> None:
    """With sliding-window groups: each group's bytes per token, and what one max_model_len
    sequence holds against keeping every layer's KV."""
    if not spec.groups.frees_blocks:
        return
    for line in spec.group_lines():
        logger.info("KV %s", line)
    kept = spec.bytes_per_seq(max_model_len)
    every = spec.bytes_per_seq_every_layer(max_model_len)
    logger.info("KV of one %d-token sequence: %.1f MiB with out-of-window blocks freed, "
                "%.1f MiB keeping every layer's KV (%.2fx)", max_model_len, kept / 2**20,
                every / 2**20, every / kept)


def plan_swap_blocks(spec: KVCacheSpec, config: EngineConfig) -> int:
    """CPU swap blocks for preemption mode "swap" (0 in recompute mode)."""
    if config.preemption_mode != "swap":
        return 0
    num = spec.num_blocks_for(int(config.swap_space * GiB))
    logger.info("swap space: %.2f GiB of CPU memory -> %d blocks of %d tokens%s",
                config.swap_space, num, spec.block_size,
                "" if num else "; every preemption will recompute")
    return num
