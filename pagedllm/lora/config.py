"""`LoRAConfig`: the engine's LoRA capacity (vLLM's flag names), validated at construction."""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_RANKS_HINT = "usual ranks are 8, 16, 32, 64"


@dataclass(frozen=True)
class LoRAConfig:
    """`max_loras` adapters live in device slots at once (a step mixes at most that many);
    `max_cpu_loras` loaded adapters stay cached in CPU memory; ranks above `max_lora_rank`
    are refused (every slot is allocated at that rank)."""

    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        if self.max_lora_rank < 1:
            raise ValueError(f"max_lora_rank must be >= 1 ({SUPPORTED_RANKS_HINT}), got "
                             f"{self.max_lora_rank}")
        if self.max_cpu_loras is None:
            object.__setattr__(self, "max_cpu_loras", self.max_loras)
        elif self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras "
                             f"({self.max_loras})")
