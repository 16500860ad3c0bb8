"""`benchmarks/peers_rounds.py`: peers.py run several times and the median of each ratio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.peers_rounds import ratio_rows  # noqa: E402


def test_ratio_rows_lines_up_every_round():
    rounds = [{"offline": {"vllm-bf16": {"1": 3.0, "64": 1.2}}, "prefill": {"vllm-bf16": 0.9}},
              {"offline": {"vllm-bf16": {"64": 1.5}}, "prefill": {"vllm-bf16": 1.1}}]
    assert ratio_rows(rounds) == {"prefill vs vllm-bf16": [0.9, 1.1],
                                  "offline c=1 vs vllm-bf16": [3.0, None],
                                  "offline c=64 vs vllm-bf16": [1.2, 1.5]}


def test_two_quick_rounds_write_medians(tmp_path):
    out = tmp_path / "rounds.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers_rounds.py"), "--rounds", "2",
         "--out", str(out), "--", "--quick", "--threads", "1", "--no-prepare",
         "--peers", "pagedllm,pagedllm-fp32", "--sections", "offline,prefill"],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ratios = json.loads(out.read_text())["ratios"]
    assert set(ratios) == {"prefill vs pagedllm-fp32", "offline c=1 vs pagedllm-fp32",
                           "offline c=2 vs pagedllm-fp32"}
    for row in ratios.values():
        assert len(row["runs"]) == 2 and all(v > 0 for v in row["runs"])
        assert min(row["runs"]) <= row["median"] <= max(row["runs"])
    assert "| prefill vs pagedllm-fp32 |" in proc.stdout


def test_refuses_a_peers_out(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers_rounds.py"), "--", "--out", "x"],
        capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and "set per round" in proc.stderr
