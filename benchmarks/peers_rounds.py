"""`benchmarks/peers.py` run several times back to back, and the median of each ratio.

On a shared VM one run's ratios are worth about +-20%: the machine's speed drifts from one
minute to the next, and peers.py runs its engines one after the other (docs/benchmarks.md,
issue 27 section). The median of a few runs is the number to quote, with the spread:

    python benchmarks/peers_rounds.py --rounds 3 -- --no-prepare --peers pagedllm,vllm-bf16 \\
        --sections offline,prefill --concurrency 1,64

Everything after `--` goes to peers.py (its `--out` is set per round). Prints one row per
ratio (pagedllm / peer: offline tok/s per concurrency, prefill tok/s) with every round's value
and the median, and writes JSON (benchmarks/results/peers_rounds.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ratio_rows(rounds: list[dict]) -> dict[str, list[float | None]]:
    """'offline c=64 vs vllm-bf16' -> that ratio in each round (None where a round lacks it)."""
    keys: dict[str, list[float | None]] = {}
    for i, ratios in enumerate(rounds):
        flat = {f"prefill vs {peer}": v for peer, v in ratios.get("prefill", {}).items()}
        for peer, levels in ratios.get("offline", {}).items():
            flat.update({f"offline c={c} vs {peer}": v for c, v in levels.items()})
        for key, value in flat.items():
            keys.setdefault(key, [None] * len(rounds))[i] = value
    return keys


def main() -> None:
    argv = sys.argv[1:]
    passthrough = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/peers_rounds.json")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if "--out" in passthrough:
        ap.error("peers.py's --out is set per round; give peers_rounds.py --out instead")
    out = Path(args.out)
    rounds = []
    for r in range(args.rounds):
        run_dir = out.with_suffix("") / f"round{r}"
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peers.py"), *passthrough,
                        "--out", str(run_dir)], check=True, cwd=ROOT)
        rounds.append(json.loads((run_dir / "peers.json").read_text())["ratios"])
    rows = ratio_rows(rounds)
    table = {}
    print("| ratio (pagedllm / peer) | " + " | ".join(f"run {r + 1}" for r in range(args.rounds))
          + " | median |\n|---|" + "---:|" * (args.rounds + 1))
    for key, values in rows.items():
        present = [v for v in values if v is not None]
        table[key] = {"runs": values, "median": statistics.median(present) if present else None}
        cells = ["-" if v is None else f"{v:.2f}" for v in values]
        med = "-" if not present else f"{table[key]['median']:.2f}"
        print(f"| {key} | " + " | ".join(cells) + f" | {med} |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"peers_args": passthrough, "ratios": table}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
