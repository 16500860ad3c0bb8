"""pagedllm against llama.cpp on one GGUF, issue 27's three numbers in one run: offline N x
128 / 128 output tok/s, one-stream decode tok/s, prefill of 512 tokens tok/s.

    python benchmarks/llamacpp_vs.py --llama-bin DIR --model file.gguf --threads 2
    python benchmarks/llamacpp_vs.py --llama-bin DIR --random-gguf CONFIG_DIR --model /tmp/r.gguf

llama.cpp (binaries in DIR, e.g. built by `benchmarks/peers.py --prepare`, or by
scripts/amx_peers.sh on a lent machine's host): `llama-bench -p 512 -n 128` (pp512: prefill;
tg128: one stream from an empty context) and `llama-batched-bench -npp 128 -ntg 128 -npl N`
(output tok/s = N x 128 / the whole time, prefill included, as pagedllm's offline number),
each with its weight repacking on (its default; on AMX CPUs the AMX kernels) and off
(`--repack 0` / `-nr`). pagedllm: default flags through `LLM` (benchmarks/int8_tiles.py's
engine_round: a 512-token prompt, 64 tokens after a 6-token prompt, the offline batch).
With `--depths 1024,2048`: one stream after a context of that many tokens too (llama-bench
`-p 0 -n 128 -d D`, its K/V filled first and not timed; pagedllm: 96 tokens after a cached
D-token prompt, minus the same call's one-token run). Rounds alternate between the engines;
best of `--rounds`. Prints a table with pagedllm's ratio to llama.cpp's best variant, writes
JSON (`--out`). Also the one-stream rates as a share of the read-bandwidth limit (issue 27:
90%): the bytes a decode token reads (every GGUF tensor; a tied model's embedding as its LM
head, an untied one's embedding not at all) at the machine's read bandwidth (torch's sum of a
512 MiB tensor on the same threads, best of 5, measured before each round).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.int8_tiles import (  # noqa: E402
    add_engine_arguments,
    decode_rate,
    engine_round,
    open_llm,
    write_random_gguf,
)
from benchmarks.peers_lib import llamacpp  # noqa: E402
from pagedllm.kernels import cpu_features  # noqa: E402

VARIANTS = {"repack": [], "no-repack": ["-nr"]}  # batched-bench's flag; llama-bench: --repack


def llama_round(bins: Path, model: Path, threads: int, offline: int,
                depths: list[int]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for name, flags in VARIANTS.items():
        cmd = [str(bins / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", "512",
               "-n", "128", "-r", "2", "--repack", "0" if flags else "1"]
        rows = {r["test"]: r["tok_s"] for r in llamacpp.parse_llama_bench(
            llamacpp.run_tool(cmd, 900))}
        numbers = {"prefill_512": rows["pp512"], "decode_1": rows["tg128"]}
        if depths:
            cmd = [str(bins / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", "0",
                   "-n", "128", "-r", "2", "--repack", "0" if flags else "1",
                   "-d", ",".join(map(str, depths))]
            rows = {r["test"]: r["tok_s"] for r in llamacpp.parse_llama_bench(
                llamacpp.run_tool(cmd, 1800))}
            for d in depths:
                numbers[f"decode_at_{d}"] = rows[f"tg128 @ d{d}"]
        if offline:
            cmd = [str(bins / "llama-batched-bench"), "-m", str(model), "-t", str(threads),
                   "-tb", str(threads), "-c", str(offline * 256 + 64), "-b", "2048",
                   "-ub", "512", "-npp", "128", "-ntg", "128", "-npl", str(offline), *flags]
            row = llamacpp.parse_batched_bench(llamacpp.run_tool(cmd, 1800))[0]
            numbers["offline"] = row["output_tok_s"]
        out[f"llama.cpp {name}"] = numbers
    return out


def read_bandwidth(threads: int) -> float:
    """Bytes per second of a `threads`-thread sum over 512 MiB of fp32 (best of 5): a read
    bandwidth a streaming kernel can reach, for the one-stream limit."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(2**27)
        x.sum()
        best = 0.0
        for _ in range(5):
            t0 = time.perf_counter()
            x.sum()
            best = max(best, x.nbytes / (time.perf_counter() - t0))
        return best
    finally:
        torch.set_num_threads(previous)


def token_bytes(model: Path) -> int:
    """Bytes of weights one decode token reads: every tensor of the GGUF but an untied model's
    token embedding (one row of it is read); a tied one's embedding is its LM head."""
    from gguf import GGUFReader

    tensors = {t.name: int(t.n_bytes) for t in GGUFReader(str(model)).tensors}
    if "output.weight" in tensors:
        tensors.pop("token_embd.weight", None)
    return sum(tensors.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-bin", type=Path, required=True, help="dir with llama-bench and "
                    "llama-batched-bench")
    ap.add_argument("--model", type=Path, required=True, help="the GGUF both engines run")
    add_engine_arguments(ap, "--model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--depths", default="", help="comma-separated context lengths for one "
                    "stream after a long context (e.g. 1024,2048)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "llamacpp_vs.json")
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",") if d]
    if args.random_gguf is not None:
        write_random_gguf(args.random_gguf, args.model)
    llm = open_llm(args.model, args.threads, args.offline)
    deep = open_deep_llm(args.model, args.threads, max(depths)) if depths else None
    engine_round(llm, 0)  # warm-up
    best: dict[str, dict[str, float]] = {}
    bandwidth = 0.0
    for _ in range(args.rounds):
        bandwidth = max(bandwidth, read_bandwidth(args.threads))
        ours = engine_round(llm, args.offline)[0]
        for d in depths:
            ours[f"decode_at_{d}"] = decode_after(deep, d)
        results = {"pagedllm (default flags)": ours,
                   **llama_round(args.llama_bin, args.model, args.threads, args.offline,
                                 depths)}
        for engine, numbers in results.items():
            for key, value in numbers.items():
                best.setdefault(engine, {})[key] = max(best.get(engine, {}).get(key, 0.0), value)
    ours = best["pagedllm (default flags)"]
    peer = {key: max(v[key] for e, v in best.items() if e.startswith("llama.cpp") and key in v)
            for key in ours}
    weights = token_bytes(args.model)
    limit = bandwidth / weights  # tok/s if a token cost only its weights' bytes
    share = {e: v["decode_1"] / limit for e, v in best.items() if "decode_1" in v}
    result = {"cpu_flags": " ".join(cpu_features.cpu_flags()), "threads": args.threads,
              "read_bandwidth_gb_s": bandwidth / 1e9, "token_weight_bytes": weights,
              "one_stream_limit_tok_s": limit, "one_stream_share_of_limit": share,
              "model": str(args.model), "offline_requests": args.offline,
              "load_average": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                      time.gmtime()),
              "engines": best, "pagedllm_over_best_llama_cpp": {
                  k: ours[k] / peer[k] for k in ours if peer.get(k)}}
    keys = ["offline", "decode_1", "prefill_512", *(f"decode_at_{d}" for d in depths)]
    print(f"| engine (best of {args.rounds}) | offline {args.offline} x 128/128 | one stream | "
          "prefill 512 | " + "".join(f"one stream after {d} | " for d in depths))
    print("|---|" + "---:|" * len(keys))
    for engine, numbers in best.items():
        print(f"| {engine} | " + " | ".join(f"{numbers.get(k, 0):.0f}" for k in keys) + " |")
    ratios = result["pagedllm_over_best_llama_cpp"]
    print("| pagedllm / best llama.cpp | " + " | ".join(f"{ratios.get(k, 0):.2f}x" for k in keys)
          + " |")
    print(f"one stream against the read-bandwidth limit ({weights / 1e6:.1f} MB a token at "
          f"{bandwidth / 1e9:.1f} GB/s: {limit:.0f} tok/s): "
          + ", ".join(f"{e} {100 * v:.0f}%" for e, v in share.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def open_deep_llm(model: Path, threads: int, depth: int):
    """An engine for the long contexts: prefix caching on (the context is prefilled once)."""
    from pagedllm import LLM

    return LLM(str(model), num_threads=threads, max_model_len=depth + 256,
               enable_prefix_caching=True, kv_cache_memory=(depth + 512) * 2**15 + 2**27)


def decode_after(llm, depth: int) -> float:
    """One-stream decode tok/s after a cached `depth`-token prompt: (1 + 96 tokens) - (1)."""
    from pagedllm import SamplingParams

    prompt = [(7 * j) % 5000 + 100 for j in range(depth)]
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(temperature=0.0, max_tokens=1),
                 use_tqdm=False)  # the prompt's blocks into the prefix cache
    return decode_rate(llm, prompt, 96)


if __name__ == "__main__":
    main()
