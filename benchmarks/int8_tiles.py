"""The int8-activation panels on AMX-int8 tiles against VNNI alone (kernels/a8_panel_tiles_cpu.h):
the default path's GEMMs (GGUF Q4_1, int8 activations) on SmolLM2-135M's shapes, and whole
generations through `LLM`, both in one process, the two alternated.

    python benchmarks/int8_tiles.py --threads 2                  # the GEMMs
    python benchmarks/int8_tiles.py --engine model.gguf          # + prefill / offline / decode
    python benchmarks/int8_tiles.py --random-gguf DIR --engine /tmp/r.gguf  # write one first

GEMMs: y = x @ W^T for the four matrices of a SmolLM2 layer (qkv 960 x 576, o 576 x 576,
gate_up 3072 x 576, down 576 x 1536) at each row count, best of `--reps`, GOP/s and the
layer's time with tiles off and on (and, mode bf16, torch's bf16 matmul over a bf16 copy of
the same weights: what AMX-bf16 tiles give prompt rows where a bf16 copy is kept; mode
prompt-amx / prompt-emulated: the GGUF panels' prompt-row kernel, bf16 tiles over the panels
dequantized per call, kernels/prompt_tiles_cpu.cpp). Engine:
prefill of a 512-token prompt (max_tokens=1), one-stream decode ((1 + N tokens) - (1 token))
/ N, N requests x 128 / 128 offline; the greedy tokens of both runs must be equal (the tiles give VNNI's bits). `--random-gguf DIR`
writes a Q4_1 GGUF of random weights with DIR's config.json and tokenizer.json (a machine
without the model package; speed does not depend on the weights' values). Needs a CPU with
AMX-int8 for the "amx" rows ("emulated" measures the software model: a check, not a speed).
Prints a table, writes JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gguf import GGMLQuantizationType as T  # noqa: E402
from gguf.quants import quantize  # noqa: E402

from benchmarks.bf16_weights import offline_batch  # noqa: E402
from pagedllm.kernels import cpu_features, cpu_ops  # noqa: E402
from pagedllm.model.layers.quant.gguf_a8_panels import GGUFA8PanelWeight  # noqa: E402

SHAPES = {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}


def best_seconds(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def select(ops, mode: str) -> None:
    """A mode's kernels: the int8 panels' tiles (off / amx / emulated), or prompt-<tiles>
    (the prompt rows on bf16 tiles, int8 tiles off)."""
    prompt = mode.startswith("prompt-")
    ops.set_int8_tiles("off" if prompt else mode)
    ops.set_prompt_tiles(mode.removeprefix("prompt-") if prompt else "off")


def gemms(ops, modes: list[str], rows: list[int], reps: int) -> dict:
    rng = np.random.default_rng(0)
    weights = {name: GGUFA8PanelWeight.from_blocks(
        T.Q4_1, quantize(rng.standard_normal((n, k), dtype=np.float32) * 0.05, T.Q4_1), (n, k))
        for name, (n, k) in SHAPES.items()}
    dense = {name: w.dequantize().to(torch.bfloat16) for name, w in weights.items()}
    out: dict = {}
    for m in rows:
        xs = {name: torch.randn(m, k) for name, (_, k) in SHAPES.items()}
        row: dict = {}
        for mode in modes:
            if mode == "bf16":  # torch's bf16 matmul (oneDNN) on a bf16 copy of the weights
                per = {name: best_seconds(
                    lambda w=dense[name], x=xs[name]: (x.to(torch.bfloat16) @ w.T).float(), reps)
                    for name in weights}
            elif mode.startswith("prompt-"):
                select(ops, mode)
                per = {name: best_seconds(lambda w=w, x=xs[name]: ops.a8_panel_bf16_linear(
                    x, w.code, w.codes, w.d, w.m, w.out_features), reps)
                    for name, w in weights.items()}
            else:
                select(ops, mode)
                per = {name: best_seconds(lambda w=w, x=xs[name]: w.linear(x), reps)
                       for name, w in weights.items()}
            row[mode] = {"layer_ms": 1e3 * sum(per.values()),
                         **{f"{name}_gops": 2 * m * n * k / per[name] / 1e9
                            for name, (n, k) in SHAPES.items()}}
        out[m] = row
    return out


def write_random_gguf(model_dir: Path, out: Path) -> Path:
    """A Q4_1 GGUF of random weights shaped as model_dir's config.json (llama architecture)."""
    import tempfile

    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.loader.gguf_writer import write_gguf

    config = AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        (Path(tmp) / "tokenizer.json").write_text((model_dir / "tokenizer.json").read_text())
        write_gguf(Path(tmp), out, "llama", T.Q4_1)
    return out


LONG_PROMPT = [(11 * j) % 5000 + 100 for j in range(512)]
SHORT_PROMPT = [1, 504, 3458, 282, 4649, 314]


def engine_round(llm, offline: int) -> tuple[dict[str, float], list]:
    """One round of the issue's three numbers through `llm`: prefill of a 512-token prompt
    (max_tokens=1, tok/s), one-stream decode ((1 + 64 tokens) - (1 token), tok/s), `offline`
    requests x 128 / 128 (output tok/s); and the offline run's greedy tokens."""
    from pagedllm import SamplingParams

    def run(prompts, max_tokens):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0, [o.outputs[0].token_ids for o in outs]

    batch = offline_batch(offline)
    numbers = {"prefill_512": 512 / run([{"prompt_token_ids": LONG_PROMPT}], 1)[0],
               "decode_1": decode_rate(llm, SHORT_PROMPT, 64)}
    tokens: list = []
    if batch:
        seconds, tokens = run(batch, 128)
        numbers["offline"] = 128 * len(batch) / seconds
    return numbers, tokens


def decode_rate(llm, prompt: list[int], tokens: int) -> float:
    """One-stream decode tok/s after `prompt`: `tokens` / ((1 + tokens) - (1 token) seconds),
    greedy, the prompt's prefill in both calls."""
    from pagedllm import SamplingParams

    def seconds(n: int) -> float:
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": prompt}],
                     SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True),
                     use_tqdm=False)
        return time.perf_counter() - t0

    one = seconds(1)
    return tokens / (seconds(1 + tokens) - one)


def open_llm(path: Path, threads: int, offline: int):
    from pagedllm import LLM

    return LLM(str(path), num_threads=threads, max_model_len=1024, enable_prefix_caching=False,
               kv_cache_memory=256 * 2**20 + offline * 2**20 * 8)


def engine(ops, path: Path, modes: list[str], threads: int, offline: int, reps: int) -> dict:
    llm = open_llm(path, threads, offline)
    best: dict = {m: {} for m in modes}
    tokens: dict[str, list] = {}
    for mode in modes:  # warm-up
        select(ops, mode)
        engine_round(llm, 0)
    for _ in range(reps):
        for mode in modes:
            select(ops, mode)
            numbers, tokens[mode] = engine_round(llm, offline)
            for key, value in numbers.items():
                best[mode][key] = max(best[mode].get(key, 0.0), value)
    if len(tokens) > 1:  # the int8 tiles give VNNI's bits; bf16 prompt rows round apart
        first = next(iter(tokens.values()))
        best["greedy_tokens_equal"] = all(t == first for t in tokens.values())
        best["greedy_sequences_equal"] = {
            mode: sum(a == b for a, b in zip(first, t, strict=True)) for mode, t in tokens.items()}
    return best


def add_engine_arguments(ap: argparse.ArgumentParser, model_flag: str) -> None:
    """--random-gguf (write the GGUF named by `model_flag` first) and --offline N."""
    ap.add_argument("--random-gguf", type=Path, default=None, help=f"write {model_flag} first: "
                    "random Q4_1 weights, this dir's config + tokenizer")
    ap.add_argument("--offline", type=int, default=64, help="requests of 128 / 128 offline")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1,8,16,32,64,128,512")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--modes", default="off,amx",
                    help="comma-separated: off, amx, emulated (the int8 panels' tiles), bf16 "
                    "(torch's bf16 matmul over a bf16 copy of the weights: oneDNN's AMX-bf16 "
                    "tiles where the CPU has them; GEMMs only), prompt-amx, prompt-emulated "
                    "(the prompt rows on bf16 tiles over the dequantized panels)")
    ap.add_argument("--engine", type=Path, default=None, help="a GGUF model: time LLM too")
    add_engine_arguments(ap, "--engine")
    ap.add_argument("--engine-reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "int8_tiles.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ops = cpu_ops.load()
    modes = args.modes.split(",")
    result: dict = {"cpu_flags": " ".join(cpu_features.cpu_flags()), "threads": args.threads,
                    "tiles_by_default": ops.int8_tiles(), "load_average": os.getloadavg()}
    result["gemms"] = gemms(ops, modes, [int(r) for r in args.rows.split(",")], args.reps)
    others = modes[1:]
    print(f"| rows | layer ms {' | layer ms '.join(modes)} | "
          + " | ".join(f"{modes[0]} / {m}" for m in others) + " |")
    print("|---:|" + "---:|" * (len(modes) + len(others)))
    for m, row in result["gemms"].items():
        ms = [row[mode]["layer_ms"] for mode in modes]
        print(f"| {m} | " + " | ".join(f"{t:.3f}" for t in ms) + " | "
              + " | ".join(f"{ms[0] / t:.2f}" for t in ms[1:]) + " |")
    if args.engine is not None:
        if args.random_gguf is not None:
            t0 = time.perf_counter()
            write_random_gguf(args.random_gguf, args.engine)
            print(f"wrote {args.engine} in {time.perf_counter() - t0:.0f} s")
        result["engine"] = engine(ops, args.engine, [m for m in modes if m != "bf16"],
                                  args.threads, args.offline, args.engine_reps)
        print(json.dumps(result["engine"], indent=1))
    ops.set_int8_tiles("auto")
    ops.set_prompt_tiles("auto")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
