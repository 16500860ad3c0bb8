"""Typed configuration, validated at construction (vLLM keeps its configs in one package too).

    engine.py       EngineConfig: what the user asked for (CLI flags, LLM(...) arguments)
    kv_cache.py     KVCacheSpec: the KV pool's shape and its derived numbers
    speculative.py  SpeculativeConfig          generation.py  --generation-config

The names below are imported on first use, so `pagedllm --help` (which reads
config.speculative) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pagedllm.lazy_exports import lazy_getattr

if TYPE_CHECKING:
    from pagedllm.config.engine import EngineConfig, parse_size, resolve_dtype
    from pagedllm.config.kv_cache import KVCacheSpec

_EXPORTS = {"EngineConfig": "pagedllm.config.engine", "parse_size": "pagedllm.config.engine",
            "resolve_dtype": "pagedllm.config.engine", "KVCacheSpec": "pagedllm.config.kv_cache"}
__all__ = ["EngineConfig", "KVCacheSpec", "parse_size", "resolve_dtype"]
__getattr__ = lazy_getattr(__name__, _EXPORTS, globals())
