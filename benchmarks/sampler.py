"""The sampler on the CPU: pagedllm's against the torch ops vLLM's sampler runs, same rows.

One step's sampling of B rows of a 49,152-token vocabulary (SmolLM2's) from random logits,
per parameter set: greedy, temperature, top-p, top-k and both. The reference is the
sequence of torch ops of vLLM v1's CPU sampler (`vllm/v1/sample/ops/topk_topp_sampler.py`,
`random_sample`): temperature division, one sort of the whole row (values and indices) for
top-k / top-p with a scatter back, softmax, an exponential race (`probs / q`, q ~ Exp(1) per
token) and argmax. pagedllm's (model/layers/sampler.py, model/layers/top_k_top_p.py): numpy
argmax for greedy rows, per-row thresholds from the largest 1,024 values, one uniform draw per
row by the inverse CDF in one C++ kernel over the logits (kernels/sampling_cpu.cpp).

    python benchmarks/sampler.py                 # B = 1, 8, 64; writes benchmarks/results/sampler.json
    python benchmarks/sampler.py --rows 1 --reps 50

`--scale` sets how peaked the logits are (logits = N(0, 1) x scale; 3 with temperature 0.7
puts ~1,000-2,000 tokens in a 0.9 nucleus, a flat case for the candidates path).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pagedllm.kernels.cpu_features import cpu_flags  # noqa: E402
from pagedllm.model.layers.sampler import Sampler, SamplingMetadata, SamplingRow  # noqa: E402
from pagedllm.sampling_params import SamplingParams  # noqa: E402

VOCAB = 49152
CASES = {
    "greedy": dict(temperature=0.0),
    "temperature 0.7": dict(temperature=0.7),
    "t 0.7, top_p 0.9": dict(temperature=0.7, top_p=0.9),
    "t 1.0, top_k 50": dict(temperature=1.0, top_k=50),
    "t 0.7, top_k 40, top_p 0.95": dict(temperature=0.7, top_k=40, top_p=0.95),
}


def torch_reference(logits: torch.Tensor, params: dict) -> torch.Tensor:
    """vLLM v1's CPU sampling ops, for one parameter set shared by every row."""
    t = params["temperature"]
    if t == 0.0:
        return logits.argmax(dim=-1)
    logits = logits / t
    k, p = params.get("top_k"), params.get("top_p")
    if k is not None or p is not None:
        s, idx = logits.sort(dim=-1, descending=False)
        if k is not None:
            kth = s.gather(-1, torch.full((s.shape[0], 1), s.shape[-1] - k))
            s = s.masked_fill(s < kth, float("-inf"))
        if p is not None:
            cum = s.softmax(dim=-1).cumsum(dim=-1)
            mask = cum <= 1 - p
            mask[:, -1] = False
            s = s.masked_fill(mask, float("-inf"))
        logits = s.scatter(-1, idx, s)
    probs = logits.softmax(dim=-1)
    q = torch.empty_like(probs).exponential_()
    return probs.div_(q).argmax(dim=-1)


def pagedllm_sample(sampler: Sampler, logits: torch.Tensor, rows: list[SamplingRow]):
    return sampler(logits, SamplingMetadata.build(rows, VOCAB, "cpu")).sampled_token_ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="1,8,64", help="batch sizes, comma-separated")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--scale", type=float, default=3.0)
    ap.add_argument("--out", default="benchmarks/results/sampler.json")
    args = ap.parse_args()
    sampler = Sampler(torch.Generator().manual_seed(0))
    results = []
    print(f"CPU: {' '.join(cpu_flags())}; {torch.get_num_threads()} threads; ms per step, "
          f"median of {args.reps} alternating reps")
    print("| rows | parameters | torch ops (vLLM's) ms | pagedllm ms | ratio |")
    print("|---:|---|---:|---:|---:|")
    for b in (int(x) for x in args.rows.split(",")):
        logits = torch.randn(b, VOCAB, generator=torch.Generator().manual_seed(b)) * args.scale
        for name, params in CASES.items():
            rows = [SamplingRow(SamplingParams(**params), [1], [])] * b
            runs = {"torch": functools.partial(torch_reference, logits, params),
                    "pagedllm": functools.partial(pagedllm_sample, sampler, logits, rows)}
            times: dict[str, list[float]] = {k: [] for k in runs}
            for f in runs.values():
                f()
            for _ in range(args.reps):
                for key, f in runs.items():
                    t0 = time.perf_counter()
                    f()
                    times[key].append((time.perf_counter() - t0) * 1e3)
            ref, ours = (statistics.median(times[k]) for k in ("torch", "pagedllm"))
            results.append({"rows": b, "params": name, "torch_ms": ref, "pagedllm_ms": ours})
            print(f"| {b} | {name} | {ref:.2f} | {ours:.2f} | {ref / ours:.1f}x |", flush=True)
    out = {"machine": {"platform": platform.platform(), "cpu_flags": cpu_flags(),
                       "threads": torch.get_num_threads(), "torch": torch.__version__},
           "args": vars(args), "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
