"""The decode attention kernel (kernels/paged_attention_cpu.cpp, what every decode step runs):
one query token per sequence over a paged fp32 cache of SmolLM2's shape (9 heads, 3 KV heads,
head 64, block size 16), 30 layers' pools so the K/V come from memory as in a real step.

Two questions, one table each:
- block order: the same sequences with their blocks in pool order (a fresh engine) and
  shuffled (any server after its first requests finish). The kernel prefetches the row 16
  tokens ahead through the block table because the hardware prefetcher stops at every block.
- one sequence: 1 vs N threads (fewer sequences than threads split the query heads).

    python benchmarks/decode_attention.py              # 2 threads, medians of --repeats
    python benchmarks/decode_attention.py --batch 64 --context 192

Prints the tables and writes JSON (benchmarks/results/decode_attention.json).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.timing import run_times  # noqa: E402
from pagedllm.kernels import cpu_ops  # noqa: E402
from pagedllm.kernels.cpu_features import cpu_flags  # noqa: E402

H, KVH, D, BS, LAYERS = 9, 3, 64, 16, 30


def _pools(num_blocks: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(num_blocks, BS, KVH, D), torch.randn(num_blocks, BS, KVH, D))
            for _ in range(LAYERS)]


def _time_step(ops, pools, q, tables, lens, repeats: int) -> float:
    """Median seconds of one decode step's attention: every layer once."""
    out = torch.empty(q.shape)

    def step() -> None:
        for kc, vc in pools:
            ops.paged_decode_attention(out, q, kc, vc, tables, lens, D ** -0.5, 0)

    return statistics.median(run_times(step, repeats))


def block_order(ops, batch: int, context: int, repeats: int, rounds: int) -> list[dict]:
    per_seq = -(-context // BS)
    pools = _pools(batch * per_seq)
    q = torch.randn(batch, H, D)
    lens = torch.full((batch,), context, dtype=torch.long)
    kv_bytes = LAYERS * batch * context * KVH * D * 4 * 2
    rows = []
    for r in range(rounds):  # alternate, so a noisy minute hits both
        for order in ("pool order", "shuffled"):
            ids = torch.arange(batch * per_seq) if order == "pool order" else torch.randperm(
                batch * per_seq)
            tables = ids.view(batch, per_seq).contiguous()
            s = _time_step(ops, pools, q, tables, lens, repeats)
            rows.append({"round": r, "order": order, "batch": batch, "context": context,
                         "ms": s * 1e3, "kv_gb_s": kv_bytes / s / 1e9})
    return rows


def one_sequence(ops, contexts: list[int], threads: int, repeats: int) -> list[dict]:
    rows = []
    for context in contexts:
        per_seq = -(-context // BS)
        pools = _pools(per_seq)
        q = torch.randn(1, H, D)
        tables = torch.randperm(per_seq).view(1, per_seq)
        lens = torch.tensor([context])
        for n in (1, threads):
            torch.set_num_threads(n)
            s = _time_step(ops, pools, q, tables, lens, repeats * 10)
            rows.append({"context": context, "threads": n, "us_per_layer": s / LAYERS * 1e6})
    torch.set_num_threads(threads)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=192)
    ap.add_argument("--contexts", default="300,1000", help="one-sequence contexts")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="benchmarks/results/decode_attention.json")
    args = ap.parse_args()
    ops = cpu_ops.load()
    if ops is None:
        raise SystemExit("the C++ CPU kernels are unavailable")
    torch.set_num_threads(args.threads)
    order = block_order(ops, args.batch, args.context, args.repeats, args.rounds)
    single = one_sequence(ops, [int(c) for c in args.contexts.split(",")], args.threads,
                          args.repeats)
    print(f"CPU flags: {' '.join(cpu_flags())}; {args.threads} threads; "
          f"{LAYERS} layers of {H} heads / {KVH} KV heads / head {D}, fp32 cache")
    print(f"\n{args.batch} sequences x {args.context} tokens, one step (ms, KV GB/s):")
    print("| order | " + " | ".join(f"round {r}" for r in range(args.rounds)) + " | median |")
    print("|---|" + "---:|" * (args.rounds + 1))
    for name in ("pool order", "shuffled"):
        ms = [r["ms"] for r in order if r["order"] == name]
        cells = [f"{m:.1f} ({r['kv_gb_s']:.1f})" for m, r in zip(
            ms, [r for r in order if r["order"] == name], strict=True)]
        print(f"| {name} | " + " | ".join(cells) + f" | {statistics.median(ms):.1f} |")
    print("\none sequence, us per layer call:")
    print("| context | 1 thread | " + f"{args.threads} threads | speed-up |\n|---:|---:|---:|---:|")
    for c in sorted({r["context"] for r in single}):
        one, many = (r["us_per_layer"] for r in single if r["context"] == c)
        print(f"| {c} | {one:.1f} | {many:.1f} | {one / many:.2f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.machine(), "cpu_flags": cpu_flags(),
                               "threads": args.threads, "block_order": order,
                               "one_sequence": single}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
