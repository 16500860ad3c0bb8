"""LoRAManager: adapters loaded into a CPU LRU cache, copied into device slots on demand,
and the per-step row -> slot mapping that the LoRALinear wrappers (layer.py) read.

    construction ──▶ every target linear wrapped in a LoRALinear (layer.py) on the model
    add_request ──load()──▶ CPU cache (max_cpu_loras, LRU by use)   request.lora = adapter
    each step   ──step(order)──▶ slots (max_loras, LRU; a slot the step needs is never evicted)
                                 mapping set for the forward pass only (a scoped context)

The scheduler admits at most `max_loras` distinct adapters into the running batch, so every
step's adapters fit in the slots. Slots are keyed by the adapter's weights hash: requests for
the same weights share a slot whatever their names.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from pagedllm.lora.adapter import LoRAAdapter, load_adapter
from pagedllm.lora.config import LoRAConfig
from pagedllm.lora.layer import LinearLoRA, LoRAMapping, LoRAStepState, install
from pagedllm.lora.request import LoRARequest
from pagedllm.lora.targets import PACKED, model_module_specs

logger = logging.getLogger(__name__)


class LoRAManager:
    """Owns the slots of every target linear of `model`, each installed on the model as a
    `LoRALinear` wrapping that linear (the model's modules are changed in place)."""

    def __init__(self, model: nn.Module, config: LoRAConfig, device: torch.device,
                 dtype: torch.dtype) -> None:
        from pagedllm.model.layers.linear import Linear

        self.config = config
        self.device, self.dtype = device, dtype
        self.specs = model_module_specs(model)
        self.state = LoRAStepState()
        self.layers: dict[str, LinearLoRA] = {}
        for name, mod in list(model.named_modules()):
            leaf = name.rpartition(".")[2]
            if isinstance(mod, Linear) and leaf != "lm_head":
                slots = LinearLoRA(self.state, mod.in_features, mod.out_features,
                                   len(PACKED.get(leaf, (leaf,))), config.max_loras,
                                   config.max_lora_rank, device, dtype)
                install(model, name, slots)
                self.layers[name] = slots
        self._cache: OrderedDict[int, LoRAAdapter] = OrderedDict()
        self._lock = threading.Lock()  # load() may run on a server thread
        self._slots: OrderedDict[str, int] = OrderedDict()  # weights hash -> slot, LRU first
        slot_bytes = sum((lin.a[0].numel() + lin.b[0].numel()) * lin.a.element_size()
                         for lin in self.layers.values())
        logger.info("LoRA: %d slots of rank %d on %d linears (%.1f MiB), CPU cache of %d",
                    config.max_loras, config.max_lora_rank, len(self.layers),
                    config.max_loras * slot_bytes / 2**20, config.max_cpu_loras)

    # ------------------------------------------------------------ CPU cache
    def load(self, request: LoRARequest) -> LoRAAdapter:
        """The adapter for `request`, from the CPU cache or read and validated from disk
        (raises AdapterError, a ValueError, for an adapter this model cannot serve)."""
        with self._lock:
            cached = self._cache.get(request.lora_int_id)
            if cached is not None and cached.path == request.lora_path:
                self._cache.move_to_end(request.lora_int_id)
                return cached
        adapter = load_adapter(request.lora_path, self.specs, name=request.lora_name,
                               int_id=request.lora_int_id, max_rank=self.config.max_lora_rank,
                               dtype=self.dtype)
        with self._lock:
            self._cache[request.lora_int_id] = adapter
            self._cache.move_to_end(request.lora_int_id)
            while len(self._cache) > self.config.max_cpu_loras:
                self._cache.popitem(last=False)
        return adapter

    def remove(self, lora_int_id: int) -> None:
        """Forget a cached adapter (requests already holding it keep running with it)."""
        with self._lock:
            self._cache.pop(lora_int_id, None)

    @property
    def cached_ids(self) -> list[int]:
        with self._lock:
            return list(self._cache)

    # ---------------------------------------------------------------- slots
    def _slot_for(self, adapter: LoRAAdapter, needed: set[str]) -> int:
        key = adapter.weights_hash
        if key in self._slots:
            self._slots.move_to_end(key)
            return self._slots[key]
        used = set(self._slots.values())
        free = [s for s in range(self.config.max_loras) if s not in used]
        if free:
            slot = free[0]
        else:
            victim = next((k for k in self._slots if k not in needed), None)
            if victim is None:
                raise RuntimeError(f"a step needs more than max_loras={self.config.max_loras} "
                                   "adapters (the scheduler should have prevented it)")
            slot = self._slots.pop(victim)
        for name, lin in self.layers.items():
            lin.set(slot, adapter.deltas.get(name, ()))
        self._slots[key] = slot
        logger.debug("LoRA adapter %r -> slot %d", adapter.name, slot)
        return slot

    @contextmanager
    def step(self, adapters: Sequence[LoRAAdapter | None], q_lens: np.ndarray
             ) -> Iterator[None]:
        """For one forward pass: request i (with `q_lens[i]` rows) runs with `adapters[i]`."""
        needed = {a.weights_hash for a in adapters if a is not None}
        slot_of = {a.weights_hash: self._slot_for(a, needed)
                   for a in adapters if a is not None}
        per_req = np.fromiter((-1 if a is None else slot_of[a.weights_hash] for a in adapters),
                              np.int64, len(adapters))
        self.state.mapping = LoRAMapping.build(np.repeat(per_req, q_lens), self.device)
        try:
            yield
        finally:
            self.state.mapping = None
