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
