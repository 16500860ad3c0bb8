"""The ISA the kernels were built for decides the engine's defaults (kernels/cpu_features.py):
int8 activations are on by default where the build's int8 dot products are SIMD (VNNI, AVX-512
BW or AVX2), for GGUF models kept quantized and for --quantization int8, and off everywhere
else."""

from __future__ import annotations

import pytest

from pagedllm.config import EngineConfig
from pagedllm.kernels import cpu_features, cpu_ops


def test_flags_and_build_isa_agree() -> None:
    flags = cpu_features.cpu_flags()
    assert "avx2" in flags and all(f.startswith(("avx", "amx", "fma", "f16c")) for f in flags)
    isa = cpu_features.int8_dot_isa()
    assert isa in ("avx512_vnni", "avx512bw", "avx2", "scalar")
    if cpu_ops._march() == "native":  # a native build uses the best the CPU has
        expected = ("avx512_vnni" if {"avx512_vnni", "avx512bw"} <= set(flags)
                    else "avx512bw" if "avx512bw" in flags else "avx2")
        assert isa == expected


@pytest.mark.parametrize(("isa", "gguf", "quantization", "expected"), [
    ("avx512_vnni", True, None, True),      # GGUF kept quantized on a VNNI build: on
    ("avx512_vnni", True, "gguf", True),
    ("avx512_vnni", False, "int8", True),   # W8A8 for --quantization int8
    ("avx512_vnni", False, None, False),    # a float checkpoint: nothing to apply to
    ("avx512_vnni", True, "none", False),   # GGUF dequantized to float
    ("avx2", True, None, True),             # maddubs pair sums: on too
    ("avx2", False, "int8", True),
    ("avx512bw", False, "int8", True),
    ("scalar", True, None, False),          # no SIMD build: the exact path
    (None, True, None, False),              # no C++ kernels
])
def test_auto_int8_activations(isa, gguf, quantization, expected, monkeypatch) -> None:
    monkeypatch.setattr(cpu_features, "int8_dot_isa", lambda: isa)
    config = EngineConfig(quantization=quantization, device="cpu")
    assert config.int8_activations is None  # auto until the checkpoint's kind is known
    config.resolve_int8_activations(gguf=gguf)
    assert config.int8_activations is expected


@pytest.mark.parametrize("explicit", [True, False])
def test_explicit_choice_is_kept(explicit, monkeypatch) -> None:
    monkeypatch.setattr(cpu_features, "int8_dot_isa", lambda: "scalar" if explicit
                        else "avx512_vnni")
    config = EngineConfig(int8_activations=explicit, device="cpu")
    config.resolve_int8_activations(gguf=True)
    assert config.int8_activations is explicit


def test_cli_flag_is_three_way() -> None:
    from pagedllm.entrypoints.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve"]).int8_activations is None
    assert parser.parse_args(["serve", "--int8-activations"]).int8_activations is True
    assert parser.parse_args(["serve", "--no-int8-activations"]).int8_activations is False
