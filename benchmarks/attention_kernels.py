"""Prefill attention kernels, one layer: the C++ varlen kernel (kernels/varlen_attention_cpu.cpp,
what the engine runs) against torch SDPA, per sequence (gathered K/V, causal) and padded to
the longest sequence with a [P, 1, max_q, L] mask (what the engine ran before the varlen
kernel), on SmolLM2's attention shape (9 heads, 3 KV heads, head 64) and Gemma 3's (4 / 1 /
256), fp32 cache, block size 16.

    python benchmarks/attention_kernels.py                 # 2 threads, wall-clock medians
    python benchmarks/attention_kernels.py --threads 1 --cpu-time

--cpu-time reports process CPU time instead of wall-clock time: on a machine shared with other
work, a thread that is descheduled does not count, so the kernel's own cost is what remains
(use it with --threads 1). Prints a table (ms per call and GFLOP/s of the causal pairs) and
writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from pagedllm.kernels import cpu_ops
from pagedllm.kernels.cpu_features import cpu_flags

CASES = {  # name: (prompt lengths, heads, KV heads, head size)
    "1 x 512 (SmolLM2)": ([512], 9, 3, 64),
    "1 x 2000 (SmolLM2)": ([2000], 9, 3, 64),
    "900 + 19 x 5 (SmolLM2)": ([900] + [5] * 19, 9, 3, 64),
    "4 x 128 (SmolLM2)": ([128] * 4, 9, 3, 64),
    "1 x 512 (Gemma 3)": ([512], 4, 1, 256),
}
BS = 16


def _layout(lens: list[int], h: int, kvh: int, d: int):
    blocks = [-(-n // BS) for n in lens]
    kc = torch.randn(sum(blocks), BS, kvh, d)
    vc = torch.randn_like(kc)
    bt = torch.zeros(len(lens), max(blocks), dtype=torch.long)
    nxt = 0
    for i, nb in enumerate(blocks):
        bt[i, :nb] = torch.arange(nxt, nxt + nb)
        nxt += nb
    qs = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    q = torch.randn(int(qs[-1]), h, d)
    return q, kc, vc, bt, torch.tensor(lens), qs


def _varlen(q, kc, vc, bt, lens, qs):
    ops = cpu_ops.load()
    out = torch.empty_like(q)
    scale = q.shape[-1] ** -0.5
    return lambda: ops.paged_varlen_attention(out, q, kc, vc, None, None, bt, lens, qs, scale,
                                              0, 0.0, None)


def _per_sequence(q, kc, vc, bt, lens, qs):
    kvh, d = kc.shape[2:]

    def run():
        for i, n in enumerate(lens.tolist()):
            k = kc[bt[i, :-(-n // BS)]].reshape(-1, kvh, d)[:n].transpose(0, 1)[None]
            v = vc[bt[i, :-(-n // BS)]].reshape(-1, kvh, d)[:n].transpose(0, 1)[None]
            qq = q[int(qs[i]):int(qs[i + 1])].transpose(0, 1)[None]
            F.scaled_dot_product_attention(qq, k, v, is_causal=True, enable_gqa=True)
    return run


def _padded(q, kc, vc, bt, lens, qs):
    """The engine's old prefill path: queries padded to the longest prompt, a full mask."""
    p, mq = len(lens), int(lens.max())
    h, d = q.shape[1:]
    kvh = kc.shape[2]
    g = h // kvh
    width = bt.shape[1] * BS
    idx = torch.arange(mq)[None] + qs[:-1, None]
    valid = torch.arange(mq)[None] < lens[:, None]
    idx = torch.where(valid, idx, 0)
    keys = torch.arange(width)
    mask = (keys[None, None] <= torch.arange(mq)[None, :, None]) & \
        (keys[None, None] < lens[:, None, None])
    mask = mask[:, None].unsqueeze(2).expand(p, 1, g, mq, width).reshape(p, 1, g * mq, width)

    def run():
        qp = q[idx].view(p, mq, kvh, g, d).permute(0, 2, 3, 1, 4).reshape(p, kvh, g * mq, d)
        kp = kc[bt].view(p, width, kvh, d).transpose(1, 2)
        vp = vc[bt].view(p, width, kvh, d).transpose(1, 2)
        F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu-time", action="store_true", help="process CPU time, not wall clock")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/attention_kernels.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter
    rows = {}
    for name, (lens, h, kvh, d) in CASES.items():
        inputs = _layout(lens, h, kvh, d)
        pairs = sum(n * (n + 1) / 2 for n in lens) * h
        rows[name] = {}
        for kernel, make in (("varlen", _varlen), ("sdpa per sequence", _per_sequence),
                             ("sdpa padded", _padded)):
            fn = make(*inputs)
            fn()
            times = []
            for _ in range(args.repeats):
                t0 = clock()
                fn()
                times.append((clock() - t0) * 1e3)
            ms = statistics.median(times)
            rows[name][kernel] = {"ms": ms, "gflops": pairs * d * 4 / ms / 1e6}
    kernels = list(next(iter(rows.values())))
    print(f"threads {args.threads}, {'CPU' if args.cpu_time else 'wall'} time, median of "
          f"{args.repeats}; CPU: {' '.join(cpu_flags())}")
    print("| case | " + " | ".join(f"{k} ms (GFLOP/s)" for k in kernels) + " |")
    print("|---|" + "---:|" * len(kernels))
    for name, r in rows.items():
        cells = [f"{r[k]['ms']:.2f} ({r[k]['gflops']:.0f})" for k in kernels]
        print(f"| {name} | " + " | ".join(cells) + " |")
    res = {"machine": {"platform": platform.platform(), "cpu_flags": cpu_flags(),
                       "torch": torch.__version__}, "args": vars(args), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
