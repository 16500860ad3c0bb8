"""pagedllm against vLLM's CPU build with the two engines loaded side by side, taking turns.

    python benchmarks/vllm_turns.py --rounds 5          # default model, vLLM bf16, 2 threads

The peers harness (benchmarks/peers.py) runs each engine once, one after the other; on a VM
whose speed drifts by up to 1.6x between minutes that ordering alone moved a ratio from
1.28x to 0.93x (docs/benchmarks.md). Here both engines load first (vLLM in its own venv,
benchmarks/peers_lib/vllm.py prepares it), then alternate rounds through a turn file, each
measuring only on its turn while the other sleeps: per round the median of three 512-token
prefills and of two 2,000-token ones (max_tokens=1, tok/s) and 64 requests x 128 / 128
offline (output tok/s, prefill included), greedy, the same token ids for both. Prints a table of the per-round medians and
ratios, writes JSON (`--out`), with the round trip of a cache line between the first two CPUs
before and after the run (benchmarks/placement.py: on this project's VMs ~80 ns on one die,
~350 on two, and the engines' speeds follow it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LONG = [(11 * j) % 5000 + 100 for j in range(512)]
LONG_2K = [(11 * j) % 5000 + 100 for j in range(2000)]  # where attention is ~half a prefill
WORKLOADS = ("prefill_512", "prefill_2000", "offline_64")
BATCH = [[(7 * i + j) % 1000 + 100 for j in range(128)] for i in range(64)]


def _engine(name: str, model: str, dtype: str, threads: int):
    """`generate(prompts, max_tokens)` of a loaded engine."""
    if name == "vllm":
        from vllm import LLM, SamplingParams

        llm = LLM(model=model, dtype=dtype, max_model_len=2048, max_num_seqs=64,
                  enable_prefix_caching=False, seed=0)
    else:
        from pagedllm import LLM, SamplingParams

        llm = LLM(model or None, num_threads=threads, max_model_len=2048,
                  enable_prefix_caching=False)

    def generate(prompts, max_tokens):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

    return generate


def _turns(name: str, other: str, first: bool, rounds: int, directory: Path,
           generate) -> None:
    """Measure round r when the turn file says `name:r`, then hand the turn over."""
    turn = directory / "turn"
    generate(BATCH[:8], 16)
    generate([LONG], 1)
    generate([LONG_2K], 1)
    (directory / f"ready_{name}").write_text("1")
    if first:
        while not (directory / f"ready_{other}").exists():
            time.sleep(0.5)
        turn.write_text(f"{name}:0")
    for r in range(rounds):
        while not (turn.exists() and turn.read_text() == f"{name}:{r}"):
            time.sleep(0.2)
        time.sleep(1)  # the other engine's threads go quiet
        prefill = {}
        for prompt, times in ((LONG, 3), (LONG_2K, 2)):
            speeds = []
            for _ in range(times):
                t0 = time.perf_counter()
                generate([prompt], 1)
                speeds.append(len(prompt) / (time.perf_counter() - t0))
            prefill[f"prefill_{len(prompt)}"] = statistics.median(speeds)
        t0 = time.perf_counter()
        generate(BATCH, 128)
        offline = len(BATCH) * 128 / (time.perf_counter() - t0)
        print(json.dumps({"engine": name, "round": r, **prefill, "offline_64": offline}),
              flush=True)
        turn.write_text(f"{other}:{r}" if first else f"{other}:{r + 1}")


def _side(argv: list[str]) -> None:
    """One engine's process: side NAME OTHER FIRST ROUNDS DIR MODEL DTYPE THREADS."""
    name, other, first, rounds, directory, model, dtype, threads = argv
    generate = _engine(name, model, dtype, int(threads))
    _turns(name, other, first == "1", int(rounds), Path(directory), generate)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", help="vLLM's dtype (bfloat16: its fast path)")
    ap.add_argument("--peer-dir", type=Path, default=Path.home() / ".cache/pagedllm/peers")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/vllm_turns.json")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.peers_lib import vllm as peer
    from pagedllm.kernels import cpu_features
    from pagedllm.loader import hf_reference_dir

    if not peer.installed(args.peer_dir):
        raise SystemExit(f"vLLM is not prepared under {args.peer_dir}: run "
                         "python benchmarks/peers.py --prepare --peers vllm")
    from benchmarks.placement import round_trip_ns

    hf_dir = str(hf_reference_dir(None))  # the default GGUF's fp32 weights, as peers.py
    placement = {"before_ns": round_trip_ns()}
    with tempfile.TemporaryDirectory() as tmp:
        common = [str(args.rounds), tmp]
        env = {**peer.vllm_env(args.threads), "PYTHONPATH": ""}
        vllm = subprocess.Popen(
            [str(peer.venv_python(args.peer_dir)), __file__, "side", "vllm", "pagedllm", "0",
             *common, hf_dir, args.dtype, str(args.threads)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=tmp)
        ours = subprocess.Popen(
            [sys.executable, __file__, "side", "pagedllm", "vllm", "1", *common, "", "",
             str(args.threads)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        lines = ours.communicate()[0].splitlines() + vllm.communicate()[0].splitlines()
    placement["after_ns"] = round_trip_ns()
    if ours.returncode or vllm.returncode:
        raise SystemExit(f"an engine failed (pagedllm rc {ours.returncode}, vLLM rc "
                         f"{vllm.returncode}); run one side by hand to see why")
    rows = [json.loads(ln) for ln in lines if ln.startswith("{")]
    med = {(e, k): statistics.median(r[k] for r in rows if r["engine"] == e)
           for e in ("pagedllm", "vllm") for k in WORKLOADS}
    print(f"| workload (median of {args.rounds} turns) | pagedllm | vLLM {args.dtype} | ratio |")
    print("|---|---:|---:|---:|")
    for k in WORKLOADS:
        print(f"| {k} | {med['pagedllm', k]:.0f} | {med['vllm', k]:.0f} | "
              f"{med['pagedllm', k] / med['vllm', k]:.2f}x |")
    print("cache line between the first two CPUs and back: "
          + ", ".join(f"{k.removesuffix('_ns')} {v:.0f} ns" for k, v in placement.items()
                      if v is not None))
    result = {"cpu_flags": " ".join(cpu_features.cpu_flags()), "threads": args.threads,
              "vllm_dtype": args.dtype, "load_average": os.getloadavg(),
              "cross_cpu_round_trip": placement, "rounds": rows,
              "medians": {f"{e}/{k}": v for (e, k), v in med.items()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "side":
        # inside vLLM's venv this folder must not shadow a package vLLM imports
        here = Path(__file__).resolve().parent
        sys.path = [p for p in sys.path if Path(p or ".").resolve() != here]
        _side(sys.argv[2:])
    else:
        main()
