"""A first start says that it is compiling the CPU kernels, where they are cached, and how long
it has been going; a cached start says it loaded them."""

from __future__ import annotations

import logging
import os
import time

from pagedllm.kernels import cpu_ops


def test_first_build_is_announced_with_elapsed_time(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pagedllm.kernels.cpu_ops")
    with cpu_ops.BuildProgress(tmp_path, every=0.05, announce_after=0.05) as progress:
        time.sleep(0.4)  # the compiler would be running here
    assert not progress.cached
    text = caplog.text
    assert f"building CPU kernels (one time, cached in {tmp_path}" in text
    assert f"{cpu_ops.build_jobs()} parallel jobs" in text
    assert "still building CPU kernels:" in text and "s so far" in text
    n = text.count("still building")
    time.sleep(0.2)
    assert caplog.text.count("still building") == n  # the heartbeat stops with the build


def test_cached_load_is_not_announced(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pagedllm.kernels.cpu_ops")
    with cpu_ops.BuildProgress(tmp_path, every=0.05, announce_after=2.0) as progress:
        time.sleep(0.05)  # a cached module loads in well under a second
    time.sleep(0.1)
    assert progress.cached and "building" not in caplog.text


def test_build_uses_every_core_unless_max_jobs_says(monkeypatch):
    monkeypatch.delenv("MAX_JOBS", raising=False)
    assert cpu_ops.build_jobs() == (os.cpu_count() or 1)
    monkeypatch.setenv("MAX_JOBS", "3")
    assert cpu_ops.build_jobs() == 3


def test_loaded_kernels_live_in_the_build_dir():
    assert cpu_ops.load() is not None
    assert (cpu_ops.build_dir() / f"{cpu_ops.module_name()}.so").is_file()


def test_progress_counts_units_and_estimates_the_rest(tmp_path, caplog):
    """Units count as done when ninja writes their object file during this build; an object
    left by an earlier build does not count."""
    caplog.set_level(logging.INFO, logger="pagedllm.kernels.cpu_ops")
    stale = tmp_path / "old.o"
    stale.write_bytes(b"")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    units = ["gemm_cpu", "fused_cpu", "old", "bindings"]
    with cpu_ops.BuildProgress(tmp_path, every=0.05, announce_after=0.01, units=units) as p:
        time.sleep(0.15)
        assert p.units_done() == 0
        (tmp_path / "gemm_cpu.o").write_bytes(b"")
        time.sleep(0.2)
        assert p.units_done() == 1
        status = p.status()
    assert status.startswith("1/4 units compiled, ") and "s left (estimate)" in status
    assert "4 units, " in caplog.text and "still building CPU kernels: 1/4 units" in caplog.text


def test_unit_seconds_reads_the_last_build_from_ninjas_log(tmp_path):
    (tmp_path / ".ninja_log").write_text(
        "# ninja log v5\n0\t9000\t1\tgemm_cpu.o\tab\n0\t30000\t1\tbindings.o\tcd\n"
        "0\t5000\t2\tgemm_cpu.o\tef\n30000\t30700\t2\tm.so\t01\n")
    assert cpu_ops.unit_seconds(tmp_path) == {"gemm_cpu": 5.0, "bindings": 30.0}
    assert cpu_ops.unit_seconds(tmp_path / "missing") == {}
