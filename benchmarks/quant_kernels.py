"""GGUF quantized linear kernel vs the fp32 packed kernel on SmolLM2's shapes, one run.

    python benchmarks/quant_kernels.py [--threads 2] [--rows 1,4,8,64,512] [--out DIR]
                                       [--layer-type Q8_0]

For each row count M it times, per decode step of SmolLM2's 30 layers + lm_head (fused qkv
576->960, o 576->576, gate_up 576->3072, down 1536->576 in Q4_1 (or --layer-type), lm_head
576->49152 in Q8_0):
  fp32      packed_linear on the dequantized weights (today's path)
  q-reg     gguf_linear, codes dequantized inside the micro-kernel (in registers)
  q-scratch gguf_linear, each panel dequantized once into an L2 scratch, fp32 micro-kernel
  a8        what `--int8-activations` (the default where the CPU has VNNI or AMX) runs: the
            matrices as int8-activation panels at every M (quant/gguf_a8_panels.py)
and prints ms per step and tokens/s if a step served M rows, plus each variant's ratio to
fp32. The crossover of q-reg and q-scratch decides `quant.gguf.IN_REGISTER_ROWS`.
(Sessions before 2026-12-06 also timed the GGUF rows kernel, `a8-int` / `a8-deq`, since
removed: the panels took every block type it served.)
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import partial
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import quantize  # noqa: E402

from benchmarks.timing import run_times  # noqa: E402
from pagedllm.kernels import cpu_ops  # noqa: E402
from pagedllm.model.layers.quant.gguf import GGUFWeight  # noqa: E402
from pagedllm.model.layers.quant.gguf_a8_panels import GGUFA8PanelWeight  # noqa: E402

VARIANTS = ("fp32", "q-reg", "q-scratch", "a8")

LAYERS = 30
SHAPES = [("qkv", 960, 576, T.Q4_1, LAYERS), ("o", 576, 576, T.Q4_1, LAYERS),
          ("gate_up", 3072, 576, T.Q4_1, LAYERS), ("down", 576, 1536, T.Q4_1, LAYERS),
          ("lm_head", 49152, 576, T.Q8_0, 1)]


def _time(fn, reps: int) -> float:
    return min(run_times(fn, reps))  # the least disturbed run: this machine is shared


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,2,4,8,16,64,512")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layer-type", default="Q4_1", choices=["Q4_0", "Q4_1", "Q4_K", "Q8_0"],
                    help="block type of the 30 layers' weights (Q8_0: a Q8_0 model)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    ops = cpu_ops.load()
    rng = np.random.default_rng(0)
    weights = []  # one weight per layer, as in the model: nothing stays cache-hot across layers
    for name, n, k, qtype, count in SHAPES:
        qtype = T[args.layer_type] if name != "lm_head" else qtype
        for _ in range(count):
            raw = quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05, qtype)
            q = GGUFWeight.from_blocks(qtype, raw, (n, k))
            a8 = GGUFA8PanelWeight.from_blocks(qtype, raw, (n, k))
            weights.append((name, q, ops.pack_linear_weight(q.dequantize()), a8))
    rows = []
    for m in [int(r) for r in args.rows.split(",")]:
        x = torch.randn(m, 1536)
        res = {"rows": m}
        for variant in VARIANTS:
            fns = []
            for _name, q, packed, a8 in weights:
                xi = x[:, :q.in_features].contiguous()
                code, n, *parts = q.kernel_args()
                if variant == "a8":
                    fn = partial(a8.linear, xi)
                elif variant == "fp32":
                    def fn(xi=xi, packed=packed, n=n):
                        return ops.packed_linear(xi, packed, n, None)
                else:
                    limit = 1 << 30 if variant == "q-reg" else 0
                    def fn(xi=xi, code=code, n=n, parts=parts, limit=limit):
                        return ops.gguf_linear(xi, code, n, *parts, limit)
                fns.append(fn)
            total = _time(lambda fns=fns: [f() for f in fns], args.reps)
            res[f"{variant}_ms"] = total * 1e3
            res[f"{variant}_tok_s"] = m / total
        rows.append(res)
        print(f"M={m:4d}  " + "  ".join(
            f"{v}: {res[f'{v}_ms']:8.2f} ms ({res[f'{v}_tok_s']:8.1f} tok/s, "
            f"{res['fp32_ms'] / res[f'{v}_ms']:.2f}x)" for v in VARIANTS),
            flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "quant_kernels.json").write_text(json.dumps(
        {"threads": args.threads, "layer_type": args.layer_type, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
