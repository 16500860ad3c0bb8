"""What this CPU and this build of the kernels can do, read once and logged at start-up.

The kernels are compiled for one target (`-march=native`, or `PAGEDLLM_CPU_MARCH`), so the
instructions a kernel runs are a property of the build, not only of the CPU: an AVX2 build
(`PAGEDLLM_CPU_MARCH=x86-64-v3`) on an AVX-512 VNNI machine runs AVX2 code. The engine's
defaults follow the build:

    int8 dot products (int8_dot_cpu.h)   int8 activations by default
    avx512_vnni (vpdpbusd)               on  (GGUF models kept quantized, --quantization int8)
    avx512bw / avx2 (maddubs pairs)      on
    scalar (no SIMD build)               off (the exact path; --int8-activations turns it on)

On a CPU with AMX-int8 (Xeon Sapphire Rapids on) the int8-activation panels (GGUF Q8_0 / Q4_0 /
Q4_1) run the whole 16-row tiles of a call of 32 rows or more on the matrix tiles and the rest
on VNNI, bit for bit the same results (kernels/a8_panel_tiles_cpu.h): 1.10-1.25x VNNI's speed
at 64 rows on a Sapphire Rapids class Xeon, 0.91-1.00x at 16 (the file's per-32-value scales
cost an epilogue per block). PAGEDLLM_INT8_TILES chooses: auto (default: amx where the build,
CPU and OS run it, else off), amx (an error where they cannot), off (VNNI only), emulated (a
software model of the tiles, for tests on CPUs without AMX; ~1000x slower).

The same tiles can run the GGUF panels' prompt rows in bf16 (kernels/prompt_tiles_cpu.cpp:
weights dequantized a panel at a time, no per-block epilogue; a row goes there because it is
a prompt position, never because of its batch: model/layers/quant/prompt_rows.py).
PAGEDLLM_PROMPT_TILES chooses the same way, but its auto is amx wherever the build, CPU and OS
run the tiles: on a Sapphire Rapids class Xeon they prefill 1.4-1.6x the int8 panels' speed
and score a lower perplexity (14.94 against 14.996 int8, 14.95 exact fp32; docs/benchmarks.md);
else vector where the build has AVX-512 BF16 (Zen 4 class): the tiles' products as VDPBF16PS
vector dot products, for the prompt rows' attention only (the int8 panels' VNNI out-runs them
on the matrices); amx, vector, emulated (tests), off.

The default dtype follows the CPU instead (torch's bf16 matmul, oneDNN, dispatches at run
time): `--dtype auto` may pick bf16 linear weights where the CPU has amx_bf16 or avx512_bf16
(`bf16_matrix_isa`; config/dtype.py has the rules).
"""

from __future__ import annotations

import functools
import logging
import os
import re
from pathlib import Path

from pagedllm.errors import InvalidInputError

logger = logging.getLogger(__name__)

_FLAG = re.compile(r"^(avx2|avx512\w*|avx_vnni\w*|amx\w*|fma|f16c)$")

# The bf16 matrix ISAs, best first, under which torch's bf16 matmul (oneDNN) is native: AMX
# tiles (Xeon Sapphire Rapids on) and AVX-512 BF16 dot products (Cooper Lake, Zen 4 on).
BF16_MATRIX_FLAGS = ("amx_bf16", "avx512_bf16")

# The int8 dot-product ISAs whose int8-activation kernels beat the exact path at every batch
# size (docs/benchmarks.md): VNNI's vpdpbusd (Zen 4/5), AVX2's maddubs pair sums (Zen 3, and
# an AVX2 build on Zen 5: 1.2-1.4x the exact path offline, one stream and prefill); AVX-512
# BW's maddubs, the AVX2 code at twice the width, was not measured apart (no CPU of that
# class came by) and follows it.
FAST_INT8_DOT = ("avx512_vnni", "avx512bw", "avx2")


@functools.cache
def cpu_flags() -> tuple[str, ...]:
    """The vector / matrix ISA flags of this CPU (/proc/cpuinfo), sorted; () if unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return tuple(sorted({f for f in line.split(":", 1)[-1].split() if _FLAG.match(f)}))


def bf16_matrix_isa(flags: tuple[str, ...] | None = None) -> str | None:
    """The best bf16 matrix ISA among `flags` (default: this CPU's), None without one:
    where `--dtype auto` on CPU may pick bf16 linear weights (config/dtype.py)."""
    have = set(cpu_flags() if flags is None else flags)
    return next((f for f in BF16_MATRIX_FLAGS if f in have), None)


def int8_dot_isa() -> str | None:
    """The instructions of the compiled kernels' int8 dot products ("avx512_vnni",
    "avx512bw", "avx2" or "scalar"), None without the C++ kernels."""
    from pagedllm.kernels import cpu_ops

    ops = cpu_ops.load()
    return None if ops is None else ops.int8_dot_isa()


INT8_TILES = ("auto", "amx", "emulated", "off")
PROMPT_TILES = ("auto", "amx", "vector", "emulated", "off")


class TilesUnavailableError(InvalidInputError):
    """PAGEDLLM_INT8_TILES or PAGEDLLM_PROMPT_TILES asks for tiles this CPU, build or OS
    cannot run (or is no choice)."""


def _configure(variable: str, choices: tuple[str, ...], setter) -> str:
    choice = os.environ.get(variable, "auto").strip().lower() or "auto"
    if choice not in choices:
        raise TilesUnavailableError(
            f"{variable} must be one of {', '.join(choices)}, got {choice!r}")
    try:
        return setter(choice)
    except ValueError as exc:
        raise TilesUnavailableError(f"{variable}={choice}: {exc}") from None


def configure_int8_tiles(ops) -> str:
    """Apply PAGEDLLM_INT8_TILES to a freshly loaded core module `ops` (cpu_ops.load calls it)
    and return the tiles in use ("amx", "emulated" or "off")."""
    return _configure("PAGEDLLM_INT8_TILES", INT8_TILES, ops.set_int8_tiles)


def configure_prompt_tiles(ops) -> str:
    """Apply PAGEDLLM_PROMPT_TILES to a freshly loaded core module `ops` (cpu_ops.load calls
    it): the tiles the GGUF panels' prompt rows run on (kernels/prompt_tiles_cpu.cpp)."""
    return _configure("PAGEDLLM_PROMPT_TILES", PROMPT_TILES, ops.set_prompt_tiles)


def int8_tiles() -> str | None:
    """The matrix tiles the int8-activation panels use for the 16-row tiles of calls of 32 rows
    or more ("amx", "emulated", "off"), None without the C++ kernels."""
    from pagedllm.kernels import cpu_ops

    ops = cpu_ops.load()
    return None if ops is None else ops.int8_tiles()


def prompt_tiles() -> str | None:
    """The tiles the GGUF panels' prompt rows run on ("amx", "vector", "emulated", "off"; bf16
    over weights dequantized per call; vector: their attention only), None without the C++
    kernels."""
    from pagedllm.kernels import cpu_ops

    ops = cpu_ops.load()
    return None if ops is None else ops.prompt_tiles()


def prompt_tiles_on() -> bool:
    """Whether a step's prompt rows go to the tiles now: the core kernels are loaded (this
    never builds them) and their prompt tiles are amx, vector or emulated."""
    from pagedllm.kernels import cpu_ops

    return "core" in cpu_ops.loaded_families() and prompt_tiles() != "off"


def prompt_matrix_tiles_on() -> bool:
    """Whether the panel matrices run the prompt rows on the tiles too (amx, emulated), not
    only their attention (vector: AVX-512 BF16 dot products lose to the int8 panels' VNNI
    on the matrices, 0.56x at a 512-token prefill on a Zen 4 class VM)."""
    return prompt_tiles_on() and prompt_tiles() != "vector"


def default_int8_activations() -> bool:
    """Whether int8 activations are the default here: the build's int8 dot products are
    SIMD (FAST_INT8_DOT), not the scalar fallback."""
    isa = int8_dot_isa()
    on = isa in FAST_INT8_DOT
    logger.info("CPU %s; int8 dot products: %s, tiles from 32 rows: %s, prompt rows on bf16 "
                "tiles: %s -> int8 activations %s by default",
                " ".join(cpu_flags()) or "(flags unknown)", isa or "none (no C++ kernels)",
                int8_tiles() or "none", prompt_tiles() or "none", "on" if on else "off")
    return on
