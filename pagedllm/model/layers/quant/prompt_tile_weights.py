"""Whether the GGUF panels keep their prompt tiles' bf16 weights (PAGEDLLM_PROMPT_TILE_WEIGHTS).

A step's prompt rows run as bf16 on AMX tiles over the panel matrices (prompt_rows.py,
kernels/prompt_tiles_cpu.cpp), each call dequantizing every panel it uses. For a long prompt
that is a tenth of the call; for the short prompts and prompt chunks of serving it is most of
it (Sapphire Rapids class Xeon, SmolLM2's gate / up matrix: 16 rows 2.4x, 64 rows 1.5x,
512 rows 1.1x faster with the tiles kept). Kept tiles hold the same bf16 values, made by the
same instructions, so every result keeps its bits; they cost 2 bytes a weight next to the
file's codes, which decode rows keep reading on the int8 path.

    auto        keep them when they come to at most 2 GiB and a quarter of the memory
                available (small models, whose prompts are compute-bound; a large model's
                prompt rows would read 2 bytes a weight from DRAM instead of ~0.6)
    keep        keep them
    dequantize  dequantize per call
"""

from __future__ import annotations

import logging
import os

from torch import nn

from pagedllm.errors import InvalidInputError
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.quant.gguf_a8_panels import GGUFA8PanelWeight

logger = logging.getLogger(__name__)

VARIABLE = "PAGEDLLM_PROMPT_TILE_WEIGHTS"
CHOICES = ("auto", "keep", "dequantize")
AUTO_LIMIT = 2 << 30  # bytes


def choice() -> str:
    """PAGEDLLM_PROMPT_TILE_WEIGHTS (default auto); another value is an InvalidInputError."""
    value = os.environ.get(VARIABLE, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise InvalidInputError(f"{VARIABLE} must be one of {', '.join(CHOICES)}, "
                                f"got {value!r}")
    return value


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def prompt_linears(model: nn.Module) -> list[Linear]:
    """The linear layers of panel matrices that prompt rows pass through: all but the lm_head
    (logits run on the sampled rows, after the prompt rows' scope)."""
    head = getattr(model, "lm_head", None)
    return [m for m in model.modules() if isinstance(m, Linear) and m is not head
            and isinstance(m.quant, GGUFA8PanelWeight)]


def keep_tiles(model: nn.Module) -> int:
    """Keeps the bf16 tiles of every panel matrix of `model` when PAGEDLLM_PROMPT_TILE_WEIGHTS
    says so (call it only where prompt rows run on the tiles); returns the bytes kept."""
    policy = choice()
    weights = list({id(m.quant): m.quant for m in prompt_linears(model)}.values())
    need = sum(2 * -(-w.out_features // 32) * 32 * w.in_features for w in weights)
    if policy == "dequantize" or not weights:
        return 0
    if policy == "auto":
        free = available_bytes()
        if need > AUTO_LIMIT or (free is not None and need > free // 4):
            logger.info("prompt tiles: panels dequantized per call (%s=auto: their bf16 tiles "
                        "would take %.0f MiB)", VARIABLE, need / 2**20)
            return 0
    kept = sum(w.keep_bf16_tiles() for w in weights)
    logger.info("prompt tiles: bf16 tiles of %d panel matrices kept, %.1f MiB (%s=%s)",
                len(weights), kept / 2**20, VARIABLE, policy)
    return kept
