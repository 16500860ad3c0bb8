"""One process at a time loads or builds a kernel module, and a dead one never blocks the rest.

torch's JIT extension loader (`torch.utils.cpp_extension.load`) guards its build directory
with a lock *file* (`<directory>/lock`) that it creates at every load, also when nothing
needs compiling (it runs ninja to find out), and deletes when done. A process killed in
that window, a server stopped during its start-up or a subprocess past its timeout, leaves
the file behind, and every later load of that module, in any process, polls it forever: the
test suite hung at collection that way, and so would the next server start.

`build_lock(directory)` holds an flock on `<directory>/build.flock` around torch's load. The
kernel drops an flock when its holder exits, however it exits; and since every load of
pagedllm's kernels goes through here (kernels/cpu_ops.build), a `lock` file found while
holding the flock belongs to no live load and is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

FLOCK_NAME = "build.flock"
TORCH_LOCK_NAME = "lock"  # torch.utils.file_baton.FileBaton's file in the build directory


@contextlib.contextmanager
def build_lock(directory: Path) -> Iterator[None]:
    """Hold the module's flock (waiting, with one log line, while another process builds or
    loads it); a stale torch lock file in `directory` is removed once the flock is ours."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / FLOCK_NAME, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process that builds or loads the CPU kernels in %s",
                        directory)
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as exc:  # a file system without flock: torch's own lock alone
            logger.warning("no flock in %s (%s): kernel loads there are guarded by torch's "
                           "lock file only", directory, exc)
            yield
            return
        try:
            stale = directory / TORCH_LOCK_NAME
            if stale.exists():
                logger.warning("removing %s, left by a kernel load that was killed before it "
                               "finished (no live process holds %s)", stale, FLOCK_NAME)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
