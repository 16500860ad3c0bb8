"""The decode attention kernel (kernels/paged_attention_cpu.cpp, what every decode step runs):
one query token per sequence over a paged cache of SmolLM2's shape (9 heads, 3 KV heads, head
64; float16 by default, the cache of the int8-activation path), 30 layers' pools so the K/V
come from memory as in a real step.

Two questions, one table each:
- block order and size: the same sequences with their blocks in pool order (a fresh engine)
  and shuffled (any server after its first requests finish), for each `--block-sizes`. The
  kernel prefetches the row 16 tokens ahead through the block table because the hardware
  prefetcher stops at every block; a larger block is fewer such stops.
- one sequence: 1 vs N threads (fewer sequences than threads split by token chunks).

    python benchmarks/decode_attention.py              # 2 threads, medians of --repeats
    python benchmarks/decode_attention.py --batch 64 --context 192 --block-sizes 16,32,64,128

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


def _pools(num_blocks: int, block_size: int = BS, dtype: torch.dtype = torch.float16,
           ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (num_blocks, block_size, KVH, D)
    return [(torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)) for _ in range(LAYERS)]


def _time_step(ops, pools, q, tables, lens, repeats: int) -> float:
    """Median seconds of one decode step's attention: every layer once."""
    out = torch.empty(q.shape)

    def step() -> None:
        for kc, vc in pools:
            ops.paged_decode_attention(out, q, kc, vc, tables, lens, D ** -0.5, 0)

    return statistics.median(run_times(step, repeats))


def block_order(ops, batch: int, context: int, repeats: int, rounds: int,
                block_sizes: list[int], dtype: torch.dtype) -> list[dict]:
    q = torch.randn(batch, H, D)
    lens = torch.full((batch,), context, dtype=torch.long)
    kv_bytes = LAYERS * batch * context * KVH * D * dtype.itemsize * 2
    rows = []
    for r in range(rounds):  # alternate, so a noisy minute hits every variant
        for bs in block_sizes:
            per_seq = -(-context // bs)
            pools = _pools(batch * per_seq, bs, dtype)
            for order in ("pool order", "shuffled"):
                ids = torch.arange(batch * per_seq) if order == "pool order" else (
                    torch.randperm(batch * per_seq))
                tables = ids.view(batch, per_seq).contiguous()
                s = _time_step(ops, pools, q, tables, lens, repeats)
                rows.append({"round": r, "order": order, "block_size": bs, "batch": batch,
                             "context": context, "ms": s * 1e3, "kv_gb_s": kv_bytes / s / 1e9})
            del pools
    return rows


def one_sequence(ops, contexts: list[int], threads: int, repeats: int,
                 dtype: torch.dtype) -> list[dict]:
    rows = []
    for context in contexts:
        per_seq = -(-context // BS)
        pools = _pools(per_seq, BS, dtype)
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
    ap.add_argument("--block-sizes", default="16", help="comma-separated KV block sizes")
    ap.add_argument("--kv-dtype", default="float16", choices=("float16", "float32"))
    ap.add_argument("--out", default="benchmarks/results/decode_attention.json")
    args = ap.parse_args()
    ops = cpu_ops.load()
    if ops is None:
        raise SystemExit("the C++ CPU kernels are unavailable")
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.kv_dtype)
    sizes = [int(b) for b in args.block_sizes.split(",")]
    order = block_order(ops, args.batch, args.context, args.repeats, args.rounds, sizes, dtype)
    single = one_sequence(ops, [int(c) for c in args.contexts.split(",")], args.threads,
                          args.repeats, dtype)
    print(f"CPU flags: {' '.join(cpu_flags())}; {args.threads} threads; "
          f"{LAYERS} layers of {H} heads / {KVH} KV heads / head {D}, {args.kv_dtype} cache")
    print(f"\n{args.batch} sequences x {args.context} tokens, one step (ms, KV GB/s):")
    print("| block size | order | " + " | ".join(f"round {r}" for r in range(args.rounds))
          + " | median |")
    print("|---:|---|" + "---:|" * (args.rounds + 1))
    for bs in sizes:
        for name in ("pool order", "shuffled"):
            mine = [r for r in order if r["order"] == name and r["block_size"] == bs]
            cells = [f"{r['ms']:.1f} ({r['kv_gb_s']:.1f})" for r in mine]
            print(f"| {bs} | {name} | " + " | ".join(cells)
                  + f" | {statistics.median(r['ms'] for r in mine):.1f} |")
    print("\none sequence, us per layer call:")
    print("| context | 1 thread | " + f"{args.threads} threads | speed-up |\n|---:|---:|---:|---:|")
    for c in sorted({r["context"] for r in single}):
        one, many = (r["us_per_layer"] for r in single if r["context"] == c)
        print(f"| {c} | {one:.1f} | {many:.1f} | {one / many:.2f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.machine(), "cpu_flags": cpu_flags(),
                               "threads": args.threads, "kv_dtype": args.kv_dtype, "block_order": order,
                               "one_sequence": single}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
