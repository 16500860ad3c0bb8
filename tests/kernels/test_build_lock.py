"""A kernel load killed half-way leaves torch's lock file behind; the next load must not wait
on it forever (the suite once hung at collection that way), while a live load or build in
another process is still waited for (kernels/build_lock.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pagedllm.kernels import cpu_ops
from pagedllm.kernels.build_lock import FLOCK_NAME, TORCH_LOCK_NAME, build_lock

LOAD = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr); "
        "from pagedllm.kernels import cpu_ops; assert cpu_ops.load() is not None; print('loaded')")


def _directory(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A private copy of the built kernel module's directory, and the environment that makes
    a subprocess load from it: a test running beside these (pytest -n) that loads the
    kernels in a subprocess would otherwise find, and remove, the lock file planted here."""
    cpu_ops.load()  # built (or loaded) here first, so the subprocesses below only load it
    built = cpu_ops.build_dir(cpu_ops.module_name("core"))
    directory = tmp_path / "extensions" / built.name
    shutil.copytree(built, directory, ignore=shutil.ignore_patterns(TORCH_LOCK_NAME, FLOCK_NAME))
    return directory, {**os.environ, "TORCH_EXTENSIONS_DIR": str(directory.parent)}


def test_a_lock_file_left_by_a_killed_load_is_removed(tmp_path) -> None:
    directory, env = _directory(tmp_path)
    (directory / TORCH_LOCK_NAME).touch()  # what a load killed inside torch's lock leaves
    proc = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0 and "loaded" in proc.stdout, proc.stderr[-3000:]
    assert "left by a kernel load that was killed" in proc.stderr
    assert not (directory / TORCH_LOCK_NAME).exists()


def test_a_live_build_is_waited_for(tmp_path) -> None:
    directory, env = _directory(tmp_path)
    with build_lock(directory):  # this process "builds": the other load must wait
        (directory / TORCH_LOCK_NAME).touch()  # torch's file of our live build
        proc = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        time.sleep(8)
        assert proc.poll() is None, proc.communicate()
        assert (directory / TORCH_LOCK_NAME).exists()  # a live holder's file stays
        (directory / TORCH_LOCK_NAME).unlink()  # as torch's load does when it finishes
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "loaded" in out, err[-3000:]
    assert "waiting for another process" in err
