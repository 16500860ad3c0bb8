"""The run's record: a JSONL training log (one object per step / evaluation) and a loss
curve PNG (train and eval) drawn with matplotlib."""

from __future__ import annotations

import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

LOG_FILE = "train_log.jsonl"
CURVE_FILE = "loss_curve.png"


class TrainingLog:
    """Appends records to OUT/train_log.jsonl and keeps them for the loss curve."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / LOG_FILE
        self.path.write_text("")
        self.records: list[dict] = []

    def write(self, **record) -> None:
        self.records.append(record)
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def plot(self, path: Path) -> Path | None:
        """Train loss per step and eval loss per evaluation; None without matplotlib."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            logger.warning("matplotlib is not installed: no loss curve drawn (%s has the "
                           "numbers)", self.path)
            return None
        train = [(r["step"], r["loss"]) for r in self.records if "loss" in r]
        evals = [(r["step"], r["eval_loss"]) for r in self.records if "eval_loss" in r]
        fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
        if train:
            ax.plot(*zip(*train, strict=True), label="train loss")
        if evals:
            ax.plot(*zip(*evals, strict=True), "o-", label="eval loss")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("cross-entropy (nats / token)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return path
