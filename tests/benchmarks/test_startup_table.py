"""benchmarks/startup.py's step table: every step's full name as a column header."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from startup import step_table  # noqa: E402


def test_step_names_are_not_cut_off_and_columns_line_up():
    steps = {"CPU kernels": 95.25, "checkpoint (config, tokenizer)": 1.62, "weights": 0.41}
    runs = [{"seconds_to_healthy": 99.0, "cpu_seconds_to_healthy": 150.0, "steps_s": steps},
            {"seconds_to_healthy": 3.0, "cpu_seconds_to_healthy": 2.5,
             "steps_s": {**steps, "CPU kernels": 0.05}}]
    header, *rows = step_table(runs).splitlines()
    assert all(name in header for name in steps)
    assert len(rows) == 2 and all(len(row) == len(header) for row in rows)
    end = header.index("checkpoint (config, tokenizer)") + len("checkpoint (config, tokenizer)")
    assert rows[0][:end].endswith("1.62")  # the number sits under its own column
