"""`benchmarks/amx_int8_probe.py --check`: the AMX-int8 prototype's tile code run through
its software tile emulator gives the VNNI micro-kernel's outputs bit for bit (the B-tile
layout unpacked from the engine's nibble lanes, TDPBSUD's operand order, the per-block
epilogue in the engine's order), so that a session with an AMX CPU measures a kernel that
is already right. The real tiles run only on an AMX CPU (the probe checks equality there)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLAGS = set(re.findall(r"avx512[a-z_0-9]*", Path("/proc/cpuinfo").read_text()))


@pytest.mark.skipif("avx512_vnni" not in FLAGS,
                    reason="the probe's kernels are AVX-512 VNNI code; this CPU lacks it")
def test_emulated_tiles_equal_the_vnni_kernel(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "amx_int8_probe.py"),
                           "--check", "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    assert len(results) == 4 and all(r["amx_emulated"] for r in results)
    assert all(r["outputs_differing"] == 0 for r in results)
    assert all(r["amx_no_block_scales_wrong"] == 0 for r in results)
