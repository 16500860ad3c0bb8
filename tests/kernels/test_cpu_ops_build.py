"""A C++ build failure is an error when kernels are required (the test suite requires them,
tests/conftest.py) and a loud fallback to the torch path otherwise; reported once."""

from __future__ import annotations

import logging

import pytest

from pagedllm.kernels import cpu_ops


@pytest.fixture
def broken_build(tmp_path, monkeypatch):
    src = tmp_path / "broken.cpp"
    src.write_text("#error this kernel source does not compile\n")
    calls = []
    real_build = cpu_ops.build

    def counting_build(sources, name):
        calls.append(name)
        return real_build(sources, name)

    monkeypatch.setattr(cpu_ops, "sources", lambda family="core": [src])
    monkeypatch.setattr(cpu_ops, "_cpu_tag", lambda: f"broken_{tmp_path.name}")
    monkeypatch.setattr(cpu_ops, "_loaded", {})
    monkeypatch.setattr(cpu_ops, "build", counting_build)
    monkeypatch.delenv("PAGEDLLM_NO_CPU_KERNELS", raising=False)
    return calls


def test_the_suite_requires_kernels_here() -> None:
    assert cpu_ops.required()
    assert cpu_ops.load() is not None


def test_required_build_failure_raises_every_time_but_builds_once(broken_build,
                                                                   monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLLM_REQUIRE_CPU_KERNELS", "1")
    for _ in range(2):
        with pytest.raises(cpu_ops.KernelBuildError, match="failed to build"):
            cpu_ops.load()
    assert len(broken_build) == 1


def test_unrequired_build_failure_falls_back_loudly(broken_build, monkeypatch,
                                                    caplog) -> None:
    monkeypatch.setenv("PAGEDLLM_REQUIRE_CPU_KERNELS", "0")
    with caplog.at_level(logging.ERROR, logger="pagedllm.kernels.cpu_ops"):
        assert cpu_ops.load() is None
        assert cpu_ops.load() is None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "FAILED TO BUILD" in errors[0].getMessage()
    assert len(broken_build) == 1


def test_target_lacks_reads_the_compilers_target() -> None:
    assert cpu_ops.target_lacks("x86-64-v3") == []
    assert cpu_ops.target_lacks("x86-64-v2") == ["AVX2", "FMA", "F16C"]
    with pytest.raises(cpu_ops.KernelBuildError, match="rejects -march=haswel"):
        cpu_ops.target_lacks("haswel")


@pytest.fixture
def v2_target(tmp_path, monkeypatch):
    """An x86-64-v2 target (no AVX2): a build, if one were attempted, is counted."""
    calls = []
    monkeypatch.setenv("PAGEDLLM_CPU_MARCH", "x86-64-v2")
    monkeypatch.setattr(cpu_ops, "_loaded", {})
    monkeypatch.setattr(cpu_ops, "build", lambda sources, name: calls.append(name))
    monkeypatch.delenv("PAGEDLLM_NO_CPU_KERNELS", raising=False)
    return calls


def test_a_target_without_avx2_takes_the_torch_path_without_building(v2_target, monkeypatch,
                                                                      caplog) -> None:
    monkeypatch.setenv("PAGEDLLM_REQUIRE_CPU_KERNELS", "0")
    with caplog.at_level(logging.ERROR, logger="pagedllm.kernels.cpu_ops"):
        assert cpu_ops.load() is None
        assert cpu_ops.load() is None
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "-march=x86-64-v2) lacks AVX2, FMA, F16C" in errors[0]
    assert "\n" not in errors[0]
    assert v2_target == []


def test_a_target_without_avx2_is_an_error_when_kernels_are_required(v2_target,
                                                                     monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLLM_REQUIRE_CPU_KERNELS", "1")
    with pytest.raises(cpu_ops.KernelBuildError, match="not built .* lacks AVX2"):
        cpu_ops.load()
    assert v2_target == []
