"""Optional C++ CPU kernels, compiled on first use with torch's JIT extension builder.

`paged_decode_attention` reads K/V straight from the block pool through the block table,
saving the gather copy that dominates decode attention on CPU (memory-bound: the gather
reads and writes every context byte before attention reads it again);
`paged_decode_attention_quant` does the same over an int8 / fp8 cache with its float16
scales, and `quantize_into_cache` writes new K/V rows into such a cache;
`packed_linear` is the fp32 linear layer over a weight packed by `pack_linear_weight`
(gemm_cpu.cpp says why it beats torch.mm here, 1.7-4x); fused_cpu.cpp has the fused
RMSNorm, RoPE and SiLU-and-mul ops of the fp32 forward pass.

If the build fails (no compiler or ninja, or a compile error) or is not attempted (a target
without AVX2, FMA and F16C: `target_lacks`), `load()` logs an error and returns None, and callers use the much slower pure-torch path; with
PAGEDLLM_REQUIRE_CPU_KERNELS=1 (the test suite sets it on machines that can build them) it
raises `KernelBuildError` instead, so a broken .cpp cannot pass CI by skipping the kernel
tests. Set PAGEDLLM_NO_CPU_KERNELS=1 to choose the torch path; PAGEDLLM_CPU_MARCH=x86-64-v3
builds for another target than this CPU (the build is cached per target). A first build logs what it does and how long
it takes; `pagedllm build-kernels` runs it ahead of time.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import subprocess
import threading
import time
from pathlib import Path

import torch

from pagedllm.errors import EngineError
from pagedllm.kernels.build_lock import build_lock

logger = logging.getLogger(__name__)
# Kernel families, each its own extension module, built the first time something asks for
# it: "core" is what every model on the CPU path runs (attention, the fp32 and bf16-weight
# GEMMs and fused ops, GGUF blocks with fp32 or int8 activations, bf16 MoE experts, random
# sampling, the C++ decode loop, which calls these, and the "int" kernels by the addresses
# that module hands out: kernels/extern_linear_cpu.h);
# "int" holds the AWQ / GPTQ int4, int8 and W8A8 kernels of HF quantized checkpoints and
# `--quantization int8`, which a GGUF or float model never builds.
FAMILIES = {
    "core": ("paged_attention_cpu.cpp", "gemm_cpu.cpp", "bf16_linear_cpu.cpp", "fused_cpu.cpp",
             "quant_gguf_cpu.cpp", "quant_a8_panels_cpu.cpp",
             "prompt_tiles_cpu.cpp",
             "decode_layers_cpu.cpp", "varlen_attention_cpu.cpp", "grouped_bf16_cpu.cpp",
             "sampling_cpu.cpp", "top_k_top_p_cpu.cpp", "bindings.cpp"),
    "int": ("quant_int_cpu.cpp", "quant_w8a8_cpu.cpp"),
}


def sources(family: str = "core") -> list[Path]:
    return [Path(__file__).with_name(name) for name in FAMILIES[family]]


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


def build_dir(name: str | None = None) -> Path:
    """Where module `name` (default: the kernels of this target) is cached:
    $TORCH_EXTENSIONS_DIR (or torch's default extensions root) / the module name."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / (name or module_name())


def module_name(family: str = "core") -> str:
    return f"pagedllm_cpu_{_cpu_tag()}" if family == "core" else (
        f"pagedllm_cpu_{family}_{_cpu_tag()}")


def build_jobs() -> int:
    """Parallel compile jobs: $MAX_JOBS (torch's cpp_extension reads it), else every core."""
    jobs = os.environ.get("MAX_JOBS", "")
    return int(jobs) if jobs.isdigit() and int(jobs) > 0 else (os.cpu_count() or 1)


class BuildProgress:
    """Says what a start is doing while torch compiles (first start, or sources changed): a
    line once the load has taken `announce_after` seconds (a cached load takes far less),
    then every `every` seconds the translation units compiled so far out of `units` (torch's
    ninja writes `<unit>.o` into `directory` as each one finishes), the elapsed time and an
    estimate of the time left; the elapsed time at the end."""

    def __init__(self, directory: Path, every: float = 20.0, announce_after: float = 1.0,
                 units: list[str] | None = None) -> None:
        self.directory, self.every, self.announce_after = directory, every, announce_after
        self.units = list(units or [])
        self.announced = False
        self._done = threading.Event()
        self._t0 = time.perf_counter()
        self._wall0 = time.time()

    def __enter__(self) -> BuildProgress:
        threading.Thread(target=self._beat, name="pagedllm-kernel-build", daemon=True).start()
        return self

    def units_done(self) -> int:
        """Units whose object file was written since this build started."""
        objects = (self.directory / f"{unit}.o" for unit in self.units)
        return sum(o.is_file() and o.stat().st_mtime >= self._wall0 for o in objects)

    def status(self) -> str:
        elapsed = self.elapsed
        if not self.units:
            return f"{elapsed:.0f} s so far"
        done, total = self.units_done(), len(self.units)
        text = f"{done}/{total} units compiled, {elapsed:.0f} s so far"
        if 0 < done < total:  # the rate so far, with every parallel job in it
            text += f", ~{elapsed / done * (total - done):.0f} s left (estimate)"
        return text

    def _beat(self) -> None:
        if self._done.wait(self.announce_after):
            return
        self.announced = True
        logger.info("building CPU kernels (one time, cached in %s; %d units, %d parallel jobs, "
                    "-march=%s) ...", self.directory, len(self.units), build_jobs(), _march())
        while not self._done.wait(self.every):
            logger.info("still building CPU kernels: %s", self.status())

    @property
    def cached(self) -> bool:
        """The module came from the cache (it loaded before a build was announced)."""
        return not self.announced

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def __exit__(self, *exc) -> None:
        self._done.set()


class KernelBuildError(EngineError):
    """The C++ CPU kernels did not build and PAGEDLLM_REQUIRE_CPU_KERNELS is set."""


# What the kernels' sources need of their build target, by the compiler's predefined macro:
# x86-64 with AVX2, FMA and F16C. Their scalar fallbacks are not maintained: an x86-64-v2
# build stops on AVX2-only headers, and with those moved it builds but computes float16
# caches wrongly (tests/kernels/test_store_into_cache.py), so such a target takes the torch
# path at once instead of a minute's failing compile and a page of compiler errors.
_NEEDED = {"__x86_64__": "x86-64", "__AVX2__": "AVX2", "__FMA__": "FMA", "__F16C__": "F16C"}


def target_lacks(march: str | None = None) -> list[str] | None:
    """The features of `_NEEDED` that the build target (-march=`march`, default this
    process's target) lacks, from the compiler's own predefined macros (~10 ms); None when
    the compiler cannot be run (the build then reports that). An -march the compiler
    rejects is a `KernelBuildError` naming it."""
    march = march or _march()
    try:
        out = subprocess.run([os.environ.get("CXX", "c++"), f"-march={march}", "-dM", "-E",
                              "-x", "c++", os.devnull],
                             capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        first = next((line for line in out.stderr.splitlines() if line.strip()), "")
        raise KernelBuildError(f"the compiler rejects -march={march}: {first.strip()}")
    defined = {line.split()[1] for line in out.stdout.splitlines()
               if line.startswith("#define ") and len(line.split()) > 1}
    return [name for macro, name in _NEEDED.items() if macro not in defined]


def required() -> bool:
    return os.environ.get("PAGEDLLM_REQUIRE_CPU_KERNELS", "") not in ("", "0")


# family -> {"module": ...} or {"error": ...}: the outcome of its one build attempt
_loaded: dict[str, dict[str, object]] = {}


def load(family: str = "core"):
    """The compiled module of a kernel family (`FAMILIES`), or None when kernels are disabled
    or (unless required) cannot be built. The outcome is remembered: a failure is reported
    once, not rebuilt on every call."""
    if family not in _loaded:
        _loaded[family] = _try_build(family)
    outcome = _loaded[family]
    if "error" in outcome:
        raise outcome["error"]
    return outcome["module"]


def load_int():
    """The integer kernels of AWQ / GPTQ / int8 weights (their own module, built on first use)."""
    return load("int")


def loaded_families() -> list[str]:
    """The families this process has built or loaded so far."""
    return [f for f, outcome in _loaded.items() if outcome.get("module") is not None]


def run_in_passing_thread(fn):
    """`fn()` in a thread of its own that exits when it returns (its value or exception
    comes back here). For the server's start-up (model load, warm-up): libgomp frees an
    exiting thread's OpenMP workers, so the engine thread that runs the steps afterwards is
    the only thread with a team. A team left behind in the main thread makes libgomp manage
    more threads than there are CPUs, and it then lets every worker sleep between parallel
    regions: a decode step run from the engine thread took 23-26 ms instead of 13-15 ms on 2
    cores (an OpenMP region from a second thread: 30 us instead of 4.5 us)."""
    import threading

    result: dict[str, object] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=target, name="pagedllm-startup", daemon=True)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def release_thread_team() -> None:
    """The calling thread runs no more parallel kernels (the server's main thread once the
    engine thread takes over): its OpenMP team shrinks to one thread and its idle workers
    exit, so the team that does run the kernels keeps its workers spinning between parallel
    regions (kernels/bindings.cpp says why that matters). A no-op when the kernels were never
    loaded or are disabled."""
    mod = _loaded.get("core", {}).get("module")
    if mod is not None:
        mod.release_thread_team()


def _try_build(family: str) -> dict[str, object]:
    if os.environ.get("PAGEDLLM_NO_CPU_KERNELS"):
        logger.warning("PAGEDLLM_NO_CPU_KERNELS is set: using the (slower) torch path")
        return {"module": None}
    try:
        lacks = target_lacks()
    except KernelBuildError as exc:
        return _unbuilt(str(exc))
    if lacks:
        return _unbuilt(f"the build target (-march={_march()}) lacks {', '.join(lacks)}, "
                        "which the C++ CPU kernels need")
    try:
        module = build(sources(family), module_name(family))
    except Exception as exc:  # noqa: BLE001 - any build failure: torch fallback or error
        if required():
            return {"error": KernelBuildError(
                f"C++ CPU kernels failed to build and PAGEDLLM_REQUIRE_CPU_KERNELS is set: {exc}")}
        logger.error("C++ CPU kernels FAILED TO BUILD; falling back to the pure-torch path, "
                     "which is several times slower. Set PAGEDLLM_NO_CPU_KERNELS=1 to choose "
                     "that path on purpose, PAGEDLLM_REQUIRE_CPU_KERNELS=1 to make this an "
                     "error. Cause: %s", exc)
        return {"module": None}
    if family == "core":  # PAGEDLLM_*_TILES; a choice this machine cannot run is an error
        from pagedllm.kernels import cpu_features

        try:
            cpu_features.configure_int8_tiles(module)
            cpu_features.configure_prompt_tiles(module)
        except cpu_features.TilesUnavailableError as exc:
            return {"error": exc}
    return {"module": module}


def _unbuilt(cause: str) -> dict[str, object]:
    """The outcome of a build not attempted because of `cause`: a KernelBuildError when the
    kernels are required, else the torch path with one error line."""
    if required():
        return {"error": KernelBuildError(
            f"C++ CPU kernels not built and PAGEDLLM_REQUIRE_CPU_KERNELS is set: {cause}")}
    logger.error("C++ CPU kernels not built: %s; using the pure-torch path, which is several "
                 "times slower (PAGEDLLM_NO_CPU_KERNELS=1 chooses it without this error)", cause)
    return {"module": None}


def build(sources: list[Path], name: str):
    """Compile `sources` into the extension module `name` (cached in `build_dir(name)`),
    with every core (`build_jobs`) and progress lines while a first build runs; one process
    at a time, and never waiting on a killed one (kernels/build_lock.py)."""
    from torch.utils.cpp_extension import load as load_ext

    directory = build_dir(name)  # build_lock creates it
    os.environ.setdefault("MAX_JOBS", str(build_jobs()))
    with build_lock(directory), \
            BuildProgress(directory, units=[p.stem for p in sources]) as progress:
        mod = load_ext(name=name, sources=[str(p) for p in sources],
                       extra_cflags=["-O3", f"-march={_march()}", "-ffast-math", "-fopenmp"],
                       extra_ldflags=["-fopenmp"], build_directory=str(directory),
                       verbose=False)
    if progress.cached:
        logger.info("CPU kernels loaded from cache in %.1f s", progress.elapsed)
    else:
        times = sorted(unit_seconds(directory).items(), key=lambda kv: -kv[1])
        logger.info("CPU kernels built in %.1f s (%d units; slowest: %s)", progress.elapsed,
                    len(sources), ", ".join(f"{u} {t:.0f} s" for u, t in times[:3]))
    return mod


def unit_seconds(directory: Path) -> dict[str, float]:
    """Compile seconds of each unit in the last build of `directory`, from ninja's log
    (`start end mtime output hash` per line, milliseconds; the last line of an output wins)."""
    seconds: dict[str, float] = {}
    try:
        lines = (directory / ".ninja_log").read_text().splitlines()
    except OSError:
        return seconds
    for line in lines:
        parts = line.split("\t")
        if len(parts) >= 4 and parts[3].endswith(".o") and parts[0].isdigit():
            seconds[parts[3][:-2]] = (int(parts[1]) - int(parts[0])) / 1000
    return seconds


def load_with(feature: str):
    """The compiled module when it was built with `feature` (its `<feature>_available()`
    says so: SIMD kernels that need instructions this target lacks report False), else None."""
    ops = load()
    probe = getattr(ops, f"{feature}_available", None)
    return ops if probe is not None and probe() else None


def fp32_ops(x, family: str = "core"):
    """The compiled module of `family` when `x` is an fp32 CPU tensor and kernels are
    available.

    None too when `x` requires grad (a training forward, pagedllm.finetune): the kernels
    work in place and have no backward, so autograd runs the torch ops instead."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.requires_grad:
        return None
    return load(family)
