"""`LoRARequest`: which adapter a request runs with (vLLM's name and fields)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """A PEFT adapter directory, named for the API and numbered for the engine.

    `lora_int_id` (>= 1) identifies the adapter inside the engine (CPU cache, device slots);
    two requests with the same id must name the same adapter. The prefix cache keys blocks by
    a hash of the adapter's files, not by the id, so changed weights never hit stale KV.
    """

    lora_name: str
    lora_int_id: int
    lora_path: str
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"lora_name must be a non-empty string, got {self.lora_name!r}")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) \
                or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
        if not self.lora_path:
            raise ValueError(f"lora_path of adapter {self.lora_name!r} must not be empty")
        object.__setattr__(self, "lora_path", str(self.lora_path))
