"""`cpu_ops.release_thread_team`: the server's main thread lets its OpenMP workers go once
the engine thread takes over (libgomp stops spinning workers when it manages more threads
than CPUs, and every kernel call then pays a wake-up). The thread that called it runs
kernels single-threaded from then on; another thread still gets its full team and the same
results."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CODE = """
import threading, torch
from pagedllm.kernels import cpu_ops
torch.set_num_threads(2)
ops = cpu_ops.load()
assert ops is not None, "kernels did not build"
x = torch.randn(5, 64)
w = ops.pack_linear_weight(torch.randn(96, 64))
ref = ops.packed_linear(x, w, 96, None)
cpu_ops.release_thread_team()
seen = {}
def engine():
    seen["threads"] = torch.get_num_threads()
    seen["same"] = bool(torch.equal(ops.packed_linear(x, w, 96, None), ref))
t = threading.Thread(target=engine)
t.start()
t.join()
after = bool(torch.equal(ops.packed_linear(x, w, 96, None), ref))
print(torch.get_num_threads(), seen["threads"], seen["same"], after)
"""


def test_release_thread_team_keeps_other_threads_team_and_results():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                         env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["1", "2", "True", "True"], out.stdout


def test_release_thread_team_without_kernels_is_a_no_op():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PAGEDLLM_NO_CPU_KERNELS": "1"}
    code = ("from pagedllm.kernels import cpu_ops\ncpu_ops.release_thread_team()\n"
            "cpu_ops.load()\ncpu_ops.release_thread_team()\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_run_in_passing_thread_returns_and_reraises():
    import threading

    import pytest

    from pagedllm.kernels.cpu_ops import run_in_passing_thread

    names = []

    def value():
        names.append(threading.current_thread().name)
        return 42

    assert run_in_passing_thread(value) == 42
    assert names == ["pagedllm-startup"]
    for exc in (ValueError("bad adapter"), SystemExit("pagedllm serve: error: x")):
        def fail(exc=exc):
            raise exc
        with pytest.raises(type(exc), match=str(exc)):
            run_in_passing_thread(fail)
