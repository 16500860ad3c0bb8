"""Every ISA path of the kernels equals its reference on any CPU that can run it, not only the
one this CPU's native build takes: the suite's kernel tests run again against a build for
another target (`PAGEDLLM_CPU_MARCH`, its own cached module), in a subprocess.

    native build     the CPU's best (AVX-512 VNNI on Zen 4/5 and Xeons; AVX2 on Zen 1)
    x86-64-v3        AVX2 + FMA + F16C: maddubs int8 dot products, 8-lane attention vectors
    skylake-avx512   AVX-512 BW without VNNI (int8_dot_cpu.h's third branch)

A target this CPU cannot run, or that is what the native build already is, is skipped with
that reason; a build failure fails the test (PAGEDLLM_REQUIRE_CPU_KERNELS=1).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagedllm.kernels import cpu_features

ROOT = Path(__file__).resolve().parents[2]
# The kernel tests that compare against a reference (no model loads, no HF runs).
KERNEL_TESTS = ["tests/model/test_varlen_attention.py", "tests/model/test_attention.py",
                "tests/model/test_attention_fp16_kv.py",
                "tests/model/quant/test_gguf_a8_panels.py",
                "tests/model/quant/test_gguf_formats.py", "tests/model/quant/test_int_kernels.py",
                "tests/model/test_fused_ops.py", "tests/model/test_moe_grouped.py",
                "tests/model/quant/test_bf16_kernel.py", "tests/model/test_moe_bf16.py",
                "tests/model/test_sampling_kernel.py"]
TARGETS = {  # march: (flags the CPU needs, what the native build would have to lack)
    "x86-64-v3": ({"avx2", "fma", "f16c"}, {"avx512bw"}),
    "skylake-avx512": ({"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"},
                       {"avx512_vnni"}),
}


@pytest.mark.slow
@pytest.mark.parametrize("march", list(TARGETS))
def test_kernels_of_another_target_equal_the_references(march: str) -> None:
    needs, native_lacks = TARGETS[march]
    flags = set(cpu_features.cpu_flags())
    if not needs <= flags:
        pytest.skip(f"this CPU lacks {' '.join(sorted(needs - flags))} for -march={march}")
    if os.environ.get("PAGEDLLM_CPU_MARCH", "native") != "native" or not native_lacks & flags:
        pytest.skip(f"the build under test already takes the -march={march} paths")
    env = {**os.environ, "PAGEDLLM_CPU_MARCH": march, "PAGEDLLM_REQUIRE_CPU_KERNELS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         "-k", "not greedy_matches_hf", *KERNEL_TESTS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1100)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and " failed" not in proc.stdout
