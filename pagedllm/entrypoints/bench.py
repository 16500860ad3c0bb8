"""`pagedllm bench throughput|serve|latency|startup`: the scripts in benchmarks/, like
`vllm bench`.

The scripts live in the source checkout (benchmarks/ next to the package; an editable
install, `pip install -e .`, finds them); each prints a table and writes JSON to
benchmarks/results/. `pagedllm bench NAME --help` shows a benchmark's flags.
"""

from __future__ import annotations

import runpy
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Benchmark:
    script: str
    summary: str


BENCHMARKS = {
    "throughput": Benchmark("throughput.py", "offline batch, single-sequence and prefill "
                            "speed vs HF transformers"),
    "serve": Benchmark("serving.py", "online load test of a running server"),
    "latency": Benchmark("latency.py", "end-to-end latency of one batch"),
    "startup": Benchmark("startup.py", "seconds from `pagedllm serve` to a healthy server"),
}


def benchmarks_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "benchmarks"


def run_benchmark(name: str, argv: list[str]) -> int:
    """Run benchmarks/<script> as its own `__main__` with `argv` (from the checkout root, so
    its results land in benchmarks/results/)."""
    script = benchmarks_dir() / BENCHMARKS[name].script
    if not script.is_file():
        sys.stderr.write(f"error: {script} not found: `pagedllm bench` runs the scripts of a "
                         "source checkout (git clone, then pip install -e .)\n")
        return 1
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [str(script), *argv]
    sys.path.insert(0, str(script.parent.parent))
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
    return 0
