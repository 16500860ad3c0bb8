"""A kernel load killed half-way leaves torch's lock file behind; the next load must not wait
on it forever (the suite once hung at collection that way), while a live load or build in
another process is still waited for (kernels/build_lock.py)."""

from __future__ import annotations

import subprocess
import sys
import time

from pagedllm.kernels import cpu_ops
from pagedllm.kernels.build_lock import TORCH_LOCK_NAME, build_lock

LOAD = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr); "
        "from pagedllm.kernels import cpu_ops; assert cpu_ops.load() is not None; print('loaded')")


def _directory():
    cpu_ops.load()  # built (or loaded) here first, so the subprocesses below only load it
    return cpu_ops.build_dir(cpu_ops.module_name("core"))


def test_a_lock_file_left_by_a_killed_load_is_removed() -> None:
    directory = _directory()
    (directory / TORCH_LOCK_NAME).touch()  # what a load killed inside torch's lock leaves
    proc = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "loaded" in proc.stdout, proc.stderr[-3000:]
    assert "left by a kernel load that was killed" in proc.stderr
    assert not (directory / TORCH_LOCK_NAME).exists()


def test_a_live_build_is_waited_for() -> None:
    directory = _directory()
    with build_lock(directory):  # this process "builds": the other load must wait
        (directory / TORCH_LOCK_NAME).touch()  # torch's file of our live build
        proc = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(8)
        assert proc.poll() is None, proc.communicate()
        assert (directory / TORCH_LOCK_NAME).exists()  # a live holder's file stays
        (directory / TORCH_LOCK_NAME).unlink()  # as torch's load does when it finishes
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "loaded" in out, err[-3000:]
    assert "waiting for another process" in err
