"""The names a client may put in `model`: the base model's served names and the LoRA adapters
(each listed in /v1/models with `parent` = the base), plus runtime load / unload.

    model = "SmolLM2-135M-Instruct"  -> base model          (lora_request None)
    model = "sql-adapter"            -> LoRARequest("sql-adapter", 3, "/adapters/sql")
    anything else                    -> 404 model_not_found

Runtime updates (POST /v1/load_lora_adapter, /v1/unload_lora_adapter) need --enable-lora and
PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING=1 (vLLM gates them the same way): a server that any
client can make read arbitrary paths is opt-in.
"""

from __future__ import annotations

import asyncio
import itertools
import os

from pagedllm.engine.async_engine import AsyncEngine
from pagedllm.entrypoints.protocol_responses import (
    ModelCard,
)
from pagedllm.errors import ModelNotFoundError
from pagedllm.lora.request import LoRARequest

RUNTIME_UPDATE_ENV = "PAGEDLLM_ALLOW_RUNTIME_LORA_UPDATING"


class ServingModels:
    """Registry of served names; the event loop thread owns it."""

    def __init__(self, engine: AsyncEngine, base_names: list[str],
                 lora_modules: list[LoRARequest] | None = None) -> None:
        self.engine = engine
        self.base_names = base_names
        self.loras: dict[str, LoRARequest] = {m.lora_name: m for m in lora_modules or []}
        self._ids = itertools.count(max((m.lora_int_id for m in self.loras.values()),
                                        default=0) + 1)

    @property
    def lora_enabled(self) -> bool:
        return self.engine.engine.lora is not None

    def resolve(self, model: str | None) -> LoRARequest | None:
        """The adapter `model` names (None: the base model); raises ModelNotFoundError."""
        if model is None or model in self.base_names:
            return None
        lora = self.loras.get(model)
        if lora is None:
            raise ModelNotFoundError(f"no base model or LoRA adapter named {model!r} is served")
        return lora

    def all_names(self) -> list[str]:
        return [*self.base_names, *self.loras]

    def cards(self, max_model_len: int) -> list[ModelCard]:
        root = self.engine.engine.model_name
        base = [ModelCard(id=n, root=root, max_model_len=max_model_len)
                for n in self.base_names]
        return base + [ModelCard(id=m.lora_name, root=m.lora_path, parent=self.base_names[0],
                                 max_model_len=max_model_len) for m in self.loras.values()]

    # ------------------------------------------------------------- runtime
    def runtime_updates_refused(self) -> str | None:
        """Why load/unload are unavailable, or None when they are allowed."""
        if not self.lora_enabled:
            return "LoRA is not enabled on this server (start it with --enable-lora)"
        if os.environ.get(RUNTIME_UPDATE_ENV, "").lower() not in ("1", "true", "yes"):
            return (f"runtime LoRA updating is disabled (set {RUNTIME_UPDATE_ENV}=1 when "
                    "starting the server)")
        return None

    async def load(self, name: str, path: str) -> LoRARequest:
        """Validate the adapter (reads it into the CPU cache) and register it under `name`;
        raises ValueError (bad name, path or adapter)."""
        if name in self.base_names or name in self.loras:
            raise ValueError(f"the name {name!r} is already served; unload it first")
        lora = LoRARequest(name, next(self._ids), path)
        await asyncio.to_thread(self.engine.engine.load_lora, lora)
        self.loras[name] = lora
        return lora

    def unload(self, name: str) -> LoRARequest:
        """Stop serving `name` (requests already running keep their adapter)."""
        lora = self.loras.pop(name, None)
        if lora is None:
            raise ModelNotFoundError(f"no LoRA adapter named {name!r} is loaded")
        self.engine.engine.lora.remove(lora.lora_int_id)
        return lora
