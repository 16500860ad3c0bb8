"""Optional C++ CPU kernels, compiled on first use with torch's JIT extension builder.

`paged_decode_attention` reads K/V straight from the block pool through the block table,
saving the gather copy that dominates decode attention on CPU (memory-bound: the gather
reads and writes every context byte before attention reads it again);
`paged_decode_attention_quant` does the same over an int8 / fp8 cache with its float16
scales, and `quantize_into_cache` writes new K/V rows into such a cache;
`packed_linear` is the fp32 linear layer over a weight packed by `pack_linear_weight`
(gemm_cpu.cpp says why it beats torch.mm here, 1.7-4x); fused_cpu.cpp has the fused
RMSNorm, RoPE and SiLU-and-mul ops of the fp32 forward pass.

If the build fails (no compiler or ninja, or a compile error), `load()` logs an error and
returns None, and callers use the much slower pure-torch path; with
PAGEDLLM_REQUIRE_CPU_KERNELS=1 (the test suite sets it on machines that can build them) it
raises `KernelBuildError` instead, so a broken .cpp cannot pass CI by skipping the kernel
tests. Set PAGEDLLM_NO_CPU_KERNELS=1 to choose the torch path; PAGEDLLM_CPU_MARCH=x86-64-v3
builds for another target than this CPU (the build is cached per target).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)
_SOURCES = [Path(__file__).with_name(name) for name in
            ("paged_attention_cpu.cpp", "gemm_cpu.cpp", "fused_cpu.cpp", "quant_gguf_cpu.cpp",
             "quant_int_cpu.cpp",
             "bindings.cpp")]


def _march() -> str:
    """Target of the build: this CPU unless PAGEDLLM_CPU_MARCH names another (for example
    x86-64-v3 for AVX2 machines, to test or ship the AVX2 code paths)."""
    return os.environ.get("PAGEDLLM_CPU_MARCH", "native")


def _cpu_tag() -> str:
    """Key the cached build by the target: the CPU's feature flags for -march=native."""
    if _march() != "native":
        return hashlib.sha1(_march().encode()).hexdigest()[:8]
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    return hashlib.sha1(flags.encode()).hexdigest()[:8]


class KernelBuildError(RuntimeError):
    """The C++ CPU kernels did not build and PAGEDLLM_REQUIRE_CPU_KERNELS is set."""


def required() -> bool:
    return os.environ.get("PAGEDLLM_REQUIRE_CPU_KERNELS", "") not in ("", "0")


_loaded: dict[str, object] = {}  # "module" or "error": the outcome of the one build attempt


def load():
    """The compiled module, or None when kernels are disabled or (unless required) cannot be
    built. The outcome is remembered: a failure is reported once, not rebuilt on every call."""
    if not _loaded:
        _loaded.update(_try_build())
    if "error" in _loaded:
        raise _loaded["error"]
    return _loaded["module"]


def _try_build() -> dict[str, object]:
    if os.environ.get("PAGEDLLM_NO_CPU_KERNELS"):
        logger.warning("PAGEDLLM_NO_CPU_KERNELS is set: using the (slower) torch path")
        return {"module": None}
    try:
        return {"module": build(_SOURCES, f"pagedllm_cpu_{_cpu_tag()}")}
    except Exception as exc:  # noqa: BLE001 - any build failure: torch fallback or error
        if required():
            return {"error": KernelBuildError(
                f"C++ CPU kernels failed to build and PAGEDLLM_REQUIRE_CPU_KERNELS is set: {exc}")}
        logger.error("C++ CPU kernels FAILED TO BUILD; falling back to the pure-torch path, "
                     "which is several times slower. Set PAGEDLLM_NO_CPU_KERNELS=1 to choose "
                     "that path on purpose, PAGEDLLM_REQUIRE_CPU_KERNELS=1 to make this an "
                     "error. Cause: %s", exc)
        return {"module": None}


def build(sources: list[Path], name: str):
    """Compile `sources` into the extension module `name` (cached by torch)."""
    from torch.utils.cpp_extension import load as load_ext

    t0 = time.perf_counter()
    mod = load_ext(name=name, sources=[str(p) for p in sources],
                   extra_cflags=["-O3", f"-march={_march()}", "-ffast-math", "-fopenmp"],
                   extra_ldflags=["-fopenmp"], verbose=False)
    logger.info("CPU kernels ready in %.1f s", time.perf_counter() - t0)
    return mod


def fp32_ops(x):
    """The compiled module when `x` is an fp32 CPU tensor and kernels are available."""
    if x.device.type != "cpu" or x.dtype != torch.float32:
        return None
    return load()
