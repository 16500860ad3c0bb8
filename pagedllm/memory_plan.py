"""Memory planning from a model config alone (no weights): what fits in a memory budget.

    weights      = parameter count x dtype bytes (from the config's shapes; with bf16 linear
                   weights under fp32 on CPU, `bf16_linear_weight_bytes`), or for a GGUF
                   file the bytes of its (quantized) tensors, which the engine keeps as they are;
                   a mixture-of-experts model holds every expert but a token reads only its
                   top-k: the plan shows total and active parameters and the experts' bytes
    KV per token = 2 (K and V) x layers x kv_heads x head_dim x KV dtype bytes   (GQA aware);
                   multi-head latent attention (DeepSeek-V2 / V3) caches one latent row:
                   layers x (kv_lora_rank + qk_rope_head_dim) x KV dtype bytes
    KV per seq   = KV per token x max_model_len (rounded up to whole blocks); with sliding-
                   window layers (Gemma 3, Mistral) their group keeps only the window's
                   blocks (core/kv_groups.py), so a long sequence holds far less
    KV budget    = memory x utilization - weights - activation peak (estimate)
    blocks       = KV budget // (KV per token x block_size)

`pagedllm plan` prints this through `plan_for_engine`, which resolves dtype, KV dtype, KV
budget and max_model_len with the engine's own code (config.py, worker/model_setup.py), so
plan and engine agree on every number; the engine logs the same KV numbers at start-up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from pagedllm.config import EngineConfig, KVCacheSpec
from pagedllm.core.kv_groups import KVGroupLayout
from pagedllm.loader.multimodal_text import text_architecture
from pagedllm.model.layers.mla import attention_parameters, latent_kv_dims
from pagedllm.model.layers.moe.spec import MoESpec

GiB = 2**30
_DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2,
                "bfloat16": 2, "bf16": 2}
_TORCH_DTYPE = {4: torch.float32, 2: torch.float16, 1: torch.int8}


def load_config(model_or_config: str) -> SimpleNamespace:
    """A config.json path, a directory holding one, or a .gguf file (metadata only)."""
    path = Path(model_or_config)
    if path.suffix == ".gguf":
        from pagedllm.loader.gguf_loader import gguf_config, open_gguf
        from pagedllm.loader.gguf_reader import block_quantized

        reader = open_gguf(path, vocabulary=False)  # a plan needs no vocabulary
        # The engine keeps GGUF blocks quantized: its weights are the file's tensor bytes.
        return SimpleNamespace(**gguf_config(reader).to_dict(),
                               weight_bytes=sum(int(t.n_bytes) for t in reader.tensors),
                               block_quantized=block_quantized(reader),
                               expert_weight_bytes=sum(int(t.n_bytes) for t in reader.tensors
                                                       if "_exps." in t.name))
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"no config.json at {path}; pass a config.json, a model directory or "
                         "a .gguf file")
    raw = json.loads(path.read_text())
    if (arch := text_architecture(SimpleNamespace(**raw))) is not None:
        # A vision-language checkpoint: the engine serves its language model alone.
        dtype = raw.get("torch_dtype") or raw.get("dtype")
        raw = {"torch_dtype": dtype, **raw["text_config"], "architectures": [arch]}
    return SimpleNamespace(**raw)


def config_dtype_bytes(cfg: SimpleNamespace) -> int:
    name = str(getattr(cfg, "torch_dtype", None) or getattr(cfg, "dtype", None) or "float16")
    return _DTYPE_BYTES.get(name.replace("torch.", ""), 2)


def parameter_count(cfg: SimpleNamespace) -> int:
    """Parameters of a Llama-family decoder from its shapes (embeddings counted once if tied)."""
    return parameter_counts(cfg)[0]


def parameter_counts(cfg: SimpleNamespace) -> tuple[int, int]:
    """(total, active per token) parameters: equal for a dense model; a mixture-of-experts
    model (model/layers/moe/spec.py) counts every expert in the total, its top-k in the
    active."""
    h, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or h // heads
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    if (getattr(cfg, "model_type", "") == "qwen2" or getattr(cfg, "attention_bias", False)
            or getattr(cfg, "qkv_bias", False)):
        attn += heads * hd + 2 * kv * hd
    family = getattr(cfg, "model_type", "")
    if family in ("qwen3", "qwen3_moe"):  # q/k RMSNorm per head
        attn += 2 * hd
    elif family in ("olmoe", "olmo2"):  # q/k RMSNorm over all heads
        attn += (heads + kv) * hd
    if family in ("gemma2", "glm4"):  # two more norms per layer (after the sublayers)
        attn += 2 * h
    if latent_kv_dims(cfg) is not None:  # multi-head latent attention: its own projections
        attn = attention_parameters(cfg)
    tied = getattr(cfg, "tie_word_embeddings", False)
    fixed = vocab * h * (1 if tied else 2) + layers * (attn + 2 * h) + h
    moe = MoESpec.from_config(cfg)
    if moe is None:
        total = fixed + layers * 3 * h * cfg.intermediate_size
        return total, total
    total, active = moe.mlp_parameters()
    return fixed + total, fixed + active


def bf16_linear_weight_bytes(cfg: SimpleNamespace) -> int:
    """Weight bytes with bf16 matrices under fp32 compute (`--dtype bfloat16` on CPU,
    model/layers/quant/bf16.py): the decoder layers' attention and MLP matrices (a MoE
    model's routers, routed and shared experts, model/layers/moe/experts.py, and dense MLPs),
    the embedding table and the lm_head (one table when tied) at 2 bytes, norms and biases at
    4. Multi-head latent attention is counted at 4 bytes (an upper bound: its absorbed
    projections are not `Linear` layers)."""
    total, _ = parameter_counts(cfg)
    h, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or h // heads
    attn = 0 if latent_kv_dims(cfg) is not None else 2 * h * heads * hd + 2 * h * kv * hd
    moe = MoESpec.from_config(cfg)
    mlp = moe.mlp_parameters()[0] if moe is not None else layers * 3 * h * cfg.intermediate_size
    tables = vocab * h * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
    matrices = layers * attn + mlp + tables
    return (total - matrices) * 4 + matrices * 2


@dataclass
class MemoryPlan:
    weight_bytes: int
    dtype: torch.dtype  # of the weights (the engine's resolved --dtype)
    kv_spec: KVCacheSpec
    kv_bytes_per_token: int
    max_model_len: int
    kv_bytes_per_seq: int
    kv_budget: int
    num_blocks: int
    full_length_seqs: int
    pairs: list[tuple[int, int]]  # (max_model_len, largest max_num_seqs at that length)
    moe: MoESpec | None = None  # a mixture-of-experts model's shape
    bf16_linear: bool = False  # bf16 linear weights under fp32 compute (CPU)
    parameters: int = 0
    active_parameters: int = 0  # read per token (the top-k experts of a MoE model)
    expert_bytes: int = 0  # of the routed experts, in the weights' dtype

    def lines(self) -> list[str]:
        s = self.kv_spec
        scale = f" + {s.scale_bytes} scale bytes per row" if s.scale_bytes else ""
        dtype = str(self.dtype).removeprefix("torch.")
        kv_dtype = str(s.dtype).removeprefix("torch.")
        out = [
            f"weights:            {self.weight_bytes / GiB:8.2f} GiB ("
            + ("bf16 linear layers and embeddings, float32 norms" if self.bf16_linear
               else dtype) + ")",
            *self.moe_lines(),
            f"KV cache dtype:     {kv_dtype}",
            f"KV bytes per token: {self.kv_bytes_per_token} B = {self.kv_bytes_per_token / 1024:g} "
            + (f"KiB (2 x {s.num_layers} layers x {s.num_kv_heads} kv_heads x {s.head_dim} "
               f"head_dim x {s.dtype_bytes} bytes{scale})" if s.parts == 2 else
               f"KiB of latent KV (multi-head latent attention: {s.num_layers} layers x "
               f"{s.head_dim} (kv_lora_rank + qk_rope_head_dim) x {s.dtype_bytes} bytes"
               f"{scale})"),
            f"KV per sequence at max_model_len {self.max_model_len}: "
            f"{self.kv_bytes_per_seq / GiB:.3f} GiB",
            f"KV budget:          {self.kv_budget / GiB:8.2f} GiB -> {self.num_blocks} blocks of "
            f"{s.block_size} tokens ({self.num_blocks * s.block_size} tokens)",
            f"full-length sequences that fit: {self.full_length_seqs}",
            "largest max_num_seqs per max_model_len:",
        ]
        out += [f"  max_model_len {length:>7d}: max_num_seqs {seqs}" for length, seqs in self.pairs]
        if s.groups.frees_blocks:
            every = s.bytes_per_seq_every_layer(self.max_model_len)
            out += [f"KV groups: {s.groups.describe()}; blocks hold {s.layers_per_block} "
                    "layers; out-of-window blocks are freed"]
            out += [f"  {line}" for line in s.group_lines()]
            out += [f"  one {self.max_model_len}-token sequence: "
                    f"{self.kv_bytes_per_seq / GiB:.3f} GiB, against {every / GiB:.3f} GiB "
                    f"keeping every layer's KV ({every / self.kv_bytes_per_seq:.2f}x)"]
        return out

    def moe_lines(self) -> list[str]:
        """Total vs active parameters and the experts' share of the weights (MoE only)."""
        if self.moe is None:
            return []
        per_expert = self.expert_bytes / self.moe.num_experts / sum(self.moe.sparse_layers)
        return [
            f"mixture of experts: {self.moe.describe()}",
            f"parameters:         {self.parameters / 1e9:.2f}B total, "
            f"{self.active_parameters / 1e9:.2f}B active per token "
            f"({self.active_parameters / self.parameters:.0%})",
            f"routed experts:     {self.expert_bytes / GiB:8.2f} GiB of the weights "
            f"({per_expert / 2**20:.1f} MiB per expert per layer)",
        ]


def _expert_bytes(cfg: SimpleNamespace, moe: MoESpec | None, wbytes: int,
                  measured: bool) -> int:
    """The routed experts' bytes: the GGUF file's `*_exps` tensors when the weights are the
    file's bytes, else their parameters x dtype bytes."""
    if moe is None:
        return 0
    if measured and getattr(cfg, "expert_weight_bytes", None):
        return int(cfg.expert_weight_bytes)
    return moe.expert_parameters() * wbytes


def plan(cfg: SimpleNamespace, *, memory_gib: float | None = None,
         kv_cache_memory_gib: float | None = None, max_model_len: int | None = None,
         block_size: int = 16, kv_dtype_bytes: int | None = None, weight_dtype_bytes: int | None
         = None, utilization: float = 0.9, max_num_batched_tokens: int = 2048) -> MemoryPlan:
    """Plan for `memory_gib` of device memory (or an explicit KV budget), in the config's own
    dtype (the checkpoint's torch_dtype) unless `weight_dtype_bytes` says otherwise."""
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    wbytes = weight_dtype_bytes or config_dtype_bytes(cfg)
    kvbytes = kv_dtype_bytes or wbytes
    from pagedllm.worker.model_setup import layer_windows

    parts = 2
    if (latent := latent_kv_dims(cfg)) is not None:
        (kv_heads, head_dim), parts = latent, 1
    spec = KVCacheSpec(num_layers=cfg.num_hidden_layers, num_kv_heads=kv_heads,
                       head_dim=head_dim, dtype=_TORCH_DTYPE[kvbytes], block_size=block_size,
                       layout=KVGroupLayout.from_windows(layer_windows(cfg)), parts=parts)
    max_len = max_model_len or int(getattr(cfg, "max_position_embeddings", 4096))
    budget = None if kv_cache_memory_gib is None else int(kv_cache_memory_gib * GiB)
    measured = getattr(cfg, "weight_bytes", None) if weight_dtype_bytes is None else None
    return _plan(cfg, spec, _TORCH_DTYPE[wbytes], max_len, budget=budget,
                 memory_bytes=None if memory_gib is None else int(memory_gib * GiB),
                 utilization=utilization, max_num_batched_tokens=max_num_batched_tokens,
                 clamp=True, weights=measured)


def plan_for_engine(cfg: SimpleNamespace, config: EngineConfig,
                    memory_bytes: int | None = None) -> MemoryPlan:
    """What `LLMEngine(config)` will do with this model: its dtype (`resolve_dtype`: fp32 on
    CPU for "auto"), its KV spec (`kv_spec_for`), its max_model_len check (`finalize`, which
    raises as the engine does past the trained length) and its KV budget (`kv_budget_bytes`:
    --kv-cache-memory, else 2 GiB on CPU; on CUDA, `memory_bytes` x utilization minus weights
    and an activation estimate, as the engine's profiling run would find).

    Raises ValueError when the weights alone do not fit `memory_bytes`.
    """
    from pagedllm.model.layers.rope_scaling import apply_rope_overrides, rope_max_len
    from pagedllm.worker.model_setup import DEFAULT_CPU_KV_BYTES, kv_spec_for

    apply_rope_overrides(cfg, config.rope_scaling, config.rope_theta)
    config.finalize(*rope_max_len(cfg))
    gguf = getattr(cfg, "weight_bytes", None) is not None
    # and with it the KV dtype 'auto', as the engine settles them
    config.resolve_int8_activations(gguf, getattr(cfg, "block_quantized", False))
    spec = kv_spec_for(cfg, config)
    budget = config.kv_cache_memory
    if budget is None and memory_bytes is None:
        if config.torch_device.type == "cuda":
            raise ValueError("on CUDA the KV budget is what --gpu-memory-utilization leaves of "
                             "the device memory: pass --memory (e.g. 24GiB) or "
                             "--kv-cache-memory")
        budget = DEFAULT_CPU_KV_BYTES
    # A GGUF the engine keeps quantized weighs its tensor bytes, not shapes x dtype.
    measured = (getattr(cfg, "weight_bytes", None) if config.quantization != "none" else None)
    held = "gguf" if gguf else ("none" if getattr(cfg, "quantization_config", None) is None
                                else "quantized")
    from pagedllm.worker.model_setup import bf16_linear_held, settle_linear_dtype

    settle_linear_dtype(config, held, cfg)
    bf16 = bf16_linear_held(config, held)
    if bf16:
        measured = bf16_linear_weight_bytes(cfg)
    return _plan(cfg, spec, config.torch_dtype, config.max_model_len, budget=budget,
                 memory_bytes=memory_bytes, utilization=config.gpu_memory_utilization,
                 max_num_batched_tokens=config.max_num_batched_tokens, clamp=False,
                 weights=measured, bf16_linear=bf16)


def _plan(cfg: SimpleNamespace, spec: KVCacheSpec, dtype: torch.dtype, max_len: int, *,
          budget: int | None, memory_bytes: int | None, utilization: float,
          max_num_batched_tokens: int, clamp: bool, weights: int | None = None,
          bf16_linear: bool = False) -> MemoryPlan:
    wbytes = torch.empty((), dtype=dtype).element_size()
    total, active = parameter_counts(cfg)
    moe = MoESpec.from_config(cfg)
    weights_measured = bool(weights)
    weights = int(weights) if weights else total * wbytes
    if budget is None:
        if memory_bytes is None:
            raise ValueError("pass memory_gib (device memory) or kv_cache_memory_gib (KV budget)")
        # Activation peak of one step: hidden states, fused qkv / gate-up and the logits rows;
        # a MoE layer's token rows are copied once per chosen expert (k rows of H and 2 I).
        ffn = 2 * cfg.intermediate_size
        if moe is not None:
            ffn = max(ffn, moe.top_k * 2 * (cfg.hidden_size + moe.intermediate_size))
        act = max_num_batched_tokens * (4 * cfg.hidden_size + ffn) * wbytes
        act += 256 * cfg.vocab_size * 4
        usable = int(memory_bytes * utilization)
        budget = usable - weights - act
        if budget <= 0 and not clamp:
            raise ValueError(
                f"the weights ({weights / GiB:.2f} GiB in {str(dtype).removeprefix('torch.')}) "
                f"and activations (~{act / GiB:.2f} GiB) do not fit {usable / GiB:.2f} GiB "
                f"({memory_bytes / GiB:.2f} GiB x utilization {utilization}); use more memory, "
                f"a smaller --dtype or a quantized model")
    budget = max(budget, 0)
    blocks = spec.num_blocks_for(budget)
    usable = max(0, blocks - (1 if spec.groups.frees_blocks else 0))  # NULL_BLOCK
    per_seq_blocks = spec.blocks_per_seq(max_len)
    pairs = []
    length = 512
    while length <= max_len:
        pairs.append((length, usable // spec.blocks_per_seq(length)))
        length *= 2
    if not pairs or pairs[-1][0] != max_len:
        pairs.append((max_len, usable // per_seq_blocks))
    return MemoryPlan(weight_bytes=weights, dtype=dtype, kv_spec=spec,
                      kv_bytes_per_token=spec.bytes_per_token, max_model_len=max_len,
                      kv_bytes_per_seq=per_seq_blocks * spec.bytes_per_block,
                      kv_budget=budget, num_blocks=blocks,
                      full_length_seqs=usable // per_seq_blocks, pairs=pairs, moe=moe,
                      parameters=total, active_parameters=active,
                      expert_bytes=_expert_bytes(cfg, moe, 2 if bf16_linear else wbytes,
                                                 measured=weights_measured),
                      bf16_linear=bf16_linear)
