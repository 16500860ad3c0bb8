"""Memory planning from a model config alone (no weights): what fits in a memory budget.

    weights      = parameter count x dtype bytes (from the config's shapes), or for a GGUF
                   file the bytes of its (quantized) tensors, which the engine keeps as they are
    KV per token = 2 (K and V) x layers x kv_heads x head_dim x KV dtype bytes   (GQA aware)
    KV per seq   = KV per token x max_model_len (rounded up to whole blocks)
    KV budget    = memory x utilization - weights - activation peak (estimate)
    blocks       = KV budget // (KV per token x block_size)

`pagedllm plan` prints this; the engine logs the same KV numbers at start-up
(engine/model_setup.py) from the same `KVCacheSpec`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

from pagedllm.config import KVCacheSpec

GiB = 2**30
_DTYPE_BYTES = {"float32": 4, "float": 4, "fp32": 4, "float16": 2, "half": 2, "fp16": 2,
                "bfloat16": 2, "bf16": 2}
_TORCH_DTYPE = {4: torch.float32, 2: torch.float16, 1: torch.int8}


def load_config(model_or_config: str) -> SimpleNamespace:
    """A config.json path, a directory holding one, or a .gguf file (metadata only)."""
    path = Path(model_or_config)
    if path.suffix == ".gguf":
        from gguf import GGUFReader

        from pagedllm.loader.gguf_loader import gguf_config

        reader = GGUFReader(str(path))
        # The engine keeps GGUF blocks quantized: its weights are the file's tensor bytes.
        return SimpleNamespace(**gguf_config(reader).to_dict(),
                               weight_bytes=sum(int(t.n_bytes) for t in reader.tensors))
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"no config.json at {path}; pass a config.json, a model directory or "
                         "a .gguf file")
    return SimpleNamespace(**json.loads(path.read_text()))


def config_dtype_bytes(cfg: SimpleNamespace) -> int:
    name = str(getattr(cfg, "torch_dtype", None) or getattr(cfg, "dtype", None) or "float16")
    return _DTYPE_BYTES.get(name.replace("torch.", ""), 2)


def parameter_count(cfg: SimpleNamespace) -> int:
    """Parameters of a Llama-family decoder from its shapes (embeddings counted once if tied)."""
    h, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or h // heads
    ffn = cfg.intermediate_size
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    if getattr(cfg, "model_type", "") == "qwen2" or getattr(cfg, "attention_bias", False):
        attn += heads * hd + 2 * kv * hd
    per_layer = attn + 3 * h * ffn + 2 * h
    tied = getattr(cfg, "tie_word_embeddings", False)
    return vocab * h * (1 if tied else 2) + layers * per_layer + h


@dataclass
class MemoryPlan:
    weight_bytes: int
    kv_spec: KVCacheSpec
    kv_bytes_per_token: int
    max_model_len: int
    kv_bytes_per_seq: int
    kv_budget: int
    num_blocks: int
    full_length_seqs: int
    pairs: list[tuple[int, int]]  # (max_model_len, largest max_num_seqs at that length)

    def lines(self) -> list[str]:
        s = self.kv_spec
        scale = f" + {s.scale_bytes} scale bytes per row" if s.scale_bytes else ""
        out = [
            f"weights:            {self.weight_bytes / GiB:8.2f} GiB",
            f"KV bytes per token: {self.kv_bytes_per_token} B = {self.kv_bytes_per_token / 1024:g} "
            f"KiB (2 x {s.num_layers} layers x {s.num_kv_heads} kv_heads x {s.head_dim} head_dim "
            f"x {s.dtype_bytes} bytes{scale})",
            f"KV per sequence at max_model_len {self.max_model_len}: "
            f"{self.kv_bytes_per_seq / GiB:.3f} GiB",
            f"KV budget:          {self.kv_budget / GiB:8.2f} GiB -> {self.num_blocks} blocks of "
            f"{s.block_size} tokens ({self.num_blocks * s.block_size} tokens)",
            f"full-length sequences that fit: {self.full_length_seqs}",
            "largest max_num_seqs per max_model_len:",
        ]
        out += [f"  max_model_len {length:>7d}: max_num_seqs {seqs}" for length, seqs in self.pairs]
        return out


def plan(cfg: SimpleNamespace, *, memory_gib: float | None = None,
         kv_cache_memory_gib: float | None = None, max_model_len: int | None = None,
         block_size: int = 16, kv_dtype_bytes: int | None = None, weight_dtype_bytes: int | None
         = None, utilization: float = 0.9, max_num_batched_tokens: int = 2048) -> MemoryPlan:
    """Plan for `memory_gib` of device memory (or an explicit KV budget)."""
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    wbytes = weight_dtype_bytes or config_dtype_bytes(cfg)
    kvbytes = kv_dtype_bytes or wbytes
    spec = KVCacheSpec(num_layers=cfg.num_hidden_layers, num_kv_heads=kv_heads,
                       head_dim=head_dim, dtype=_TORCH_DTYPE[kvbytes], block_size=block_size)
    if weight_dtype_bytes is None and getattr(cfg, "weight_bytes", None):
        weights = int(cfg.weight_bytes)  # measured (a quantized GGUF), not shapes x dtype
    else:
        weights = parameter_count(cfg) * wbytes
    max_len = max_model_len or int(getattr(cfg, "max_position_embeddings", 4096))
    if kv_cache_memory_gib is not None:
        budget = int(kv_cache_memory_gib * GiB)
    elif memory_gib is not None:
        # Activation peak of one step: hidden states, fused qkv / gate-up and the logits rows.
        act = max_num_batched_tokens * (4 * cfg.hidden_size + 2 * cfg.intermediate_size) * wbytes
        act += 256 * cfg.vocab_size * 4
        budget = int(memory_gib * GiB * utilization) - weights - act
    else:
        raise ValueError("pass memory_gib (device memory) or kv_cache_memory_gib (KV budget)")
    budget = max(budget, 0)
    blocks = spec.num_blocks_for(budget)
    per_seq_blocks = spec.blocks_per_seq(max_len)
    pairs = []
    length = 512
    while length <= max_len:
        pairs.append((length, blocks // spec.blocks_per_seq(length)))
        length *= 2
    if not pairs or pairs[-1][0] != max_len:
        pairs.append((max_len, blocks // per_seq_blocks))
    return MemoryPlan(weight_bytes=weights, kv_spec=spec, kv_bytes_per_token=spec.bytes_per_token,
                      max_model_len=max_len, kv_bytes_per_seq=per_seq_blocks * spec.bytes_per_block,
                      kv_budget=budget, num_blocks=blocks,
                      full_length_seqs=blocks // per_seq_blocks, pairs=pairs)
