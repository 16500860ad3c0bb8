"""AMX-int8 tiles against the AVX-512 VNNI micro-kernel for the default path's GEMM (Q4_1
panels x int8 activations, per-32-value block scales), before writing an engine kernel:
benchmarks/amx_int8_probe.cpp, compiled here with g++ for this CPU.

    python benchmarks/amx_int8_probe.py              # SmolLM2's four projections, M 16..512
    python benchmarks/amx_int8_probe.py --check      # the AMX code in a software tile
                                                     # emulator, on any AVX-512 VNNI CPU

On a CPU with amx_int8 it times both kernels on the same data (best of --reps, 1 and 2
threads) and checks that they agree bit for bit (same block epilogue in the same order), and
times the tiles without the per-block epilogue (one int32 sum over K: what the per-32 scales
cost; checked against integer dot products); on one without, it times VNNI alone. Prints a table, writes benchmarks/results/amx_int8_probe.json
(or --out). Needs AVX-512 VNNI (both kernels are written for 512-bit registers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "benchmarks" / "amx_int8_probe.cpp"
# SmolLM2-135M's projections (N, K): qkv, o, gate_up, down
SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def cpu_flags() -> list[str]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return sorted(set(re.findall(r"avx512[a-z_0-9]*|avx2|amx[a-z_0-9]*|avx_vnni", text)))


def build(out: Path, emulate: bool) -> None:
    cmd = ["g++", "-O3", "-march=native", "-fopenmp", "-o", str(out), str(SOURCE)]
    if emulate:
        cmd.insert(1, "-DPROBE_EMULATE_AMX")
    subprocess.run(cmd, check=True)


def run(binary: Path, m: int, n: int, k: int, reps: int, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_PROC_BIND": "true"}
    proc = subprocess.run([str(binary), str(m), str(n), str(k), str(reps)], env=env,
                          capture_output=True, text=True)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{binary.name} {m} {n} {k}: exit {proc.returncode}: {proc.stderr}")
    return json.loads(proc.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="16,64,512", help="M values (multiples of 16)")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--check", action="store_true",
                    help="emulated tiles, small shapes: the layouts and epilogue, no timing")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    flags = cpu_flags()
    if "avx512_vnni" not in flags:
        print(f"needs AVX-512 VNNI; this CPU has {' '.join(flags)}", file=sys.stderr)
        return 2
    rows = [int(r) for r in args.rows.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    shapes = SHAPES
    if args.check:
        rows, threads, shapes = [16, 48], [2], {"small": (64, 64), "o-like": (96, 576)}
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "probe"
        build(binary, emulate=args.check)
        results = [{"shape": name, **run(binary, m, n, k, 1 if args.check else args.reps, t)}
                   for name, (n, k) in shapes.items() for m in rows for t in threads]
    print(f"CPU flags: {' '.join(flags)}")
    print("| shape | M | N | K | threads | VNNI GOP/s | AMX GOP/s | AMX / VNNI | "
          "AMX without block scales GOP/s | outputs differing |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        amx, ceiling = r.get("amx_gops"), r.get("amx_no_block_scales_gops")
        print(f"| {r['shape']} | {r['M']} | {r['N']} | {r['K']} | {r['threads']} | "
              f"{r['vnni_gops']:.0f} | {'-' if amx is None else f'{amx:.0f}'} | "
              f"{r.get('amx_over_vnni', '-')} | "
              f"{'-' if ceiling is None else f'{ceiling:.0f}'} | "
              f"{r.get('outputs_differing', r.get('amx', '-'))} |")
    bad = [r for r in results
           if r.get("outputs_differing") or r.get("amx_no_block_scales_wrong")]
    out = args.out or ROOT / "benchmarks" / "results" / (
        "amx_int8_probe_check.json" if args.check else "amx_int8_probe.json")
    out.write_text(json.dumps({"cpu_flags": flags, "machine": platform.processor(),
                               "emulated": args.check, "results": results}, indent=1) + "\n")
    if bad:
        print(f"{len(bad)} runs where AMX and VNNI differ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
