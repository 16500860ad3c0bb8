"""Helpers of the fine-tuning tests: JSONL files and a learnable synthetic dataset."""

from __future__ import annotations

import json
from pathlib import Path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def pattern_rows(n: int = 12) -> list[dict]:
    """"count i:" -> the next 8 digits from i (mod 10): learnable from the prompt alone."""
    return [{"prompt": f"count {i}:",
             "completion": " " + " ".join(str((i + k) % 10) for k in range(8))}
            for i in range(n)]
