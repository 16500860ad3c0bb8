"""Decode step time vs context length: pagedllm vs HF transformers, same weights, one run.

    python benchmarks/long_context.py                     # 256..8192 at batch 1 and 8
    python benchmarks/long_context.py --quick             # 256 and 1024, smoke test
    python benchmarks/long_context.py --write-docs        # also update docs/benchmarks.md

For each batch size B and context length L, B sequences hold L tokens of KV and one decode
step is timed (`LLMEngine.step()` for pagedllm; one `model(...)` call with a `DynamicCache`
for HF, greedy). The contexts are synthetic on both sides: the KV holds random values and
prefill is skipped (pagedllm: the model's forward is stubbed out while the prompts are
"prefilled"; HF: the cache is built directly), because a step's cost does not depend on the
values and a real 8 x 8192-token prefill takes many minutes on a small CPU.

Also timed: appending one token's K and V for all layers. pagedllm writes it into its slot
of the preallocated pool (no copy, constant in L); HF's DynamicCache concatenates (copies
the whole layer cache, linear in L).

Writes benchmarks/results/long_context.{json,png} and prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.timing import run_times  # noqa: E402
from pagedllm import SamplingParams  # noqa: E402
from pagedllm.config import EngineConfig  # noqa: E402
from pagedllm.engine.llm_engine import LLMEngine  # noqa: E402
from pagedllm.loader import hf_reference_dir  # noqa: E402

logger = logging.getLogger("benchmarks.long_context")

DOCS_SECTION = "## Long context"


@contextlib.contextmanager
def stubbed_forward(model: torch.nn.Module, hidden_size: int):
    """The model's forward returns zeros without touching the KV cache."""
    def forward(input_ids, *args, **kwargs):
        return torch.zeros(input_ids.shape[0], hidden_size, dtype=model.lm_head.weight.dtype,
                           device=input_ids.device)

    model.forward = forward
    try:
        yield
    finally:
        del model.forward


# ------------------------------------------------------------------ pagedllm

def make_engine(lengths, batches, threads) -> tuple[LLMEngine, int]:
    """(engine with a pool for max(batches) sequences of max(lengths) + 64, slots per seq)."""
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(hf_reference_dir(None))
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    bytes_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 4
    per_seq = max(lengths) + 64
    engine = LLMEngine(EngineConfig(
        model=None, dtype="float32", num_threads=threads, max_num_seqs=max(batches),
        # Every prompt of a point is (stub-)prefilled in one step, so that no sequence starts
        # decoding, and growing, while the others are still being prefilled.
        max_num_batched_tokens=max(batches) * max(lengths),
        kv_cache_memory=bytes_per_token * per_seq * max(batches),
        # The last timed step of the 8192 point attends to 8192 keys and SmolLM2's limit is
        # 8192 tokens; the few positions past it only matter for timing.
        max_model_len=per_seq, allow_long_max_model_len=True))
    engine.cache.kv.normal_()   # random, finite keys/values for the synthetic contexts
    return engine, per_seq


def pagedllm_point(engine: LLMEngine, b: int, n: int, steps: int, warmup: int, per_seq: int,
                    gen: torch.Generator) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=warmup + steps + 2, ignore_eos=True)
    ids = [engine.add_request(torch.randint(2, engine.vocab_size, (n - warmup - steps,),
                                            generator=gen).tolist(), params)
           for _ in range(b)]
    with stubbed_forward(engine.model, engine.model.config.hidden_size):
        started = [o for o in engine.step() if o.outputs[0].token_ids]
    running = list(engine.scheduler.running)
    assert len(started) == len(running) == b, "all prompts must be prefilled in one step"
    times = run_times(engine.step, steps, warmup)
    assert all(r.num_computed_tokens == n for r in running), (
        "the last timed step must decode b sequences attending to n keys each")
    engine.abort_request(ids)

    # One token's K/V for each of the b sequences, every layer, written into its slot.
    _, _, _, _, kvh, head_dim = engine.cache.kv.shape
    pools = [(k.view(-1, kvh, head_dim), v.view(-1, kvh, head_dim))
             for k, v, *_ in engine.cache.layer_caches]
    slots = torch.arange(b) * per_seq + n
    k_new = torch.randn(b, kvh, head_dim).to(engine.cache.kv.dtype)  # what the pool stores

    def append():
        for k_pool, v_pool in pools:
            k_pool.index_copy_(0, slots, k_new)
            v_pool.index_copy_(0, slots, k_new)

    return summary("pagedllm", b, n, times, run_times(append, 15, warmup=5))


# ------------------------------------------------------------------------ HF

def make_hf_model(threads: int):
    import transformers

    torch.set_num_threads(threads)
    return transformers.AutoModelForCausalLM.from_pretrained(
        hf_reference_dir(None), dtype=torch.float32, attn_implementation="sdpa").eval()


@torch.inference_mode()
def hf_point(model, b: int, n: int, steps: int, warmup: int, gen: torch.Generator) -> dict:
    from transformers import DynamicCache

    cfg = model.config
    kvh = cfg.num_key_value_heads
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    past = n - warmup - steps
    cache = DynamicCache(config=cfg)
    for layer in range(cfg.num_hidden_layers):
        cache.update(torch.randn(b, kvh, past, head_dim, generator=gen),
                     torch.randn(b, kvh, past, head_dim, generator=gen), layer)
    state = {"ids": torch.randint(2, cfg.vocab_size, (b, 1), generator=gen), "pos": past}

    def step():
        out = model(input_ids=state["ids"], cache=cache, use_cache=True,
                    position_ids=torch.full((b, 1), state["pos"]))
        state["ids"] = out.logits[:, -1].argmax(-1, keepdim=True)
        state["pos"] += 1

    times = run_times(step, steps, warmup)
    k_new = torch.randn(b, kvh, 1, head_dim)

    def append():
        for layer in range(cfg.num_hidden_layers):
            cache.update(k_new, k_new, layer)

    return summary("hf", b, n, times, run_times(append, 5, warmup=0))


# ------------------------------------------------------------------- report

def summary(engine: str, b: int, n: int, steps: list[float], appends: list[float]) -> dict:
    """Median and best of the timed steps (ms). Best-of is what the plot shows: on a shared
    machine it is the least disturbed by other work."""
    row = {"engine": engine, "batch": b, "context": n,
           "step_ms": 1e3 * statistics.median(steps), "step_ms_best": 1e3 * min(steps),
           "append_kv_ms": 1e3 * statistics.median(appends),
           "append_kv_ms_best": 1e3 * min(appends),
           "step_ms_samples": [round(1e3 * t, 2) for t in steps]}
    logger.info("%-8s  B=%d L=%5d  step %7.1f ms (best %7.1f)  append %.3f ms", engine, b, n,
                row["step_ms"], row["step_ms_best"], row["append_kv_ms_best"])
    return row


def table(rows: list[dict]) -> str:
    by = {(r["engine"], r["batch"], r["context"]): r for r in rows}
    batches = sorted({r["batch"] for r in rows})
    lengths = sorted({r["context"] for r in rows})
    lines = ["| batch | context | pagedllm step, ms: median (best) | HF step, ms: median (best) "
             "| HF / pagedllm (best) | pagedllm KV append, best (ms) | HF KV append, best (ms) |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for b in batches:
        for n in lengths:
            p, h = by.get(("pagedllm", b, n)), by.get(("hf", b, n))
            if p is None or h is None:
                continue
            lines.append(
                f"| {b} | {n} | {p['step_ms']:.1f} ({p['step_ms_best']:.1f}) | "
                f"{h['step_ms']:.1f} ({h['step_ms_best']:.1f}) | "
                f"{h['step_ms_best'] / p['step_ms_best']:.2f} | {p['append_kv_ms_best']:.3f} | "
                f"{h['append_kv_ms_best']:.3f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = {"pagedllm": "-o", "hf": "--s"}
    for engine in ("pagedllm", "hf"):
        for b in sorted({r["batch"] for r in rows}):
            pts = sorted((r["context"], r["step_ms_best"], r["append_kv_ms_best"]) for r in rows
                         if r["engine"] == engine and r["batch"] == b)
            label = f"{'HF transformers' if engine == 'hf' else 'pagedllm'}, batch {b}"
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], styles[engine], label=label)
            ax2.plot([p[0] for p in pts], [p[2] for p in pts], styles[engine], label=label)
    for ax, title in ((ax1, "decode step, best of N (ms)"),
                      (ax2, "append one token's KV, all layers, best of N (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length (tokens)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M, fp32, CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def update_docs(path: Path, body: str) -> None:
    """Replace (or append) the '## Long context' section, leaving the others alone."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(DOCS_SECTION + "\n")
    section = f"{DOCS_SECTION}\n\n{body.strip()}\n"
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(DOCS_SECTION))
        text = text[:start] + section + ("" if end < 0 else text[end:])
    path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+",
                    default=[256, 512, 1024, 2048, 4096, 8192])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=9, help="timed decode steps per point")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--quick", action="store_true", help="256 and 1024 only, 3 steps")
    ap.add_argument("--out", default="benchmarks/results/long_context.json")
    ap.add_argument("--write-docs", nargs="?", const="docs/benchmarks.md", default=None,
                    help="update the Long context section of this file")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("pagedllm").setLevel(logging.WARNING)
    if args.quick:
        args.lengths, args.steps = [256, 1024], 3
    t0 = time.perf_counter()
    engine, per_seq = make_engine(args.lengths, args.batches, args.threads)
    hf_model = make_hf_model(args.threads)
    gen = torch.Generator().manual_seed(0)
    load = [os.getloadavg()[0]]
    rows = []
    # Both engines at each point back to back, so that they share the machine's conditions.
    for b in args.batches:
        for n in args.lengths:
            rows.append(pagedllm_point(engine, b, n, args.steps, args.warmup, per_seq, gen))
            rows.append(hf_point(hf_model, b, n, args.steps, args.warmup, gen))
            gc.collect()
            load.append(os.getloadavg()[0])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"model": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to fp32)",
            "dtype": "float32", "threads": args.threads, "steps": args.steps,
            "warmup": args.warmup, "torch": torch.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "load_average_1min": [round(x, 2) for x in load],
            "seconds": round(time.perf_counter() - t0, 1)}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    png = out.with_suffix(".png")
    plot(rows, png)
    md = table(rows)
    print(md)
    print(f"\nwrote {out} and {png} in {meta['seconds']} s")
    if args.write_docs:
        body = f"""\
Generated by `python benchmarks/long_context.py --write-docs` (the run took {meta['seconds']} s).
One decode step of B sequences that each hold L tokens of context: pagedllm's
`LLMEngine.step()` vs HF transformers' model with a `DynamicCache` and SDPA attention, same
weights (SmolLM2-135M-Instruct, fp32), {args.threads} threads, {meta['machine']}, torch
{torch.__version__}; {args.steps} timed steps per point after {args.warmup} warm-up steps.
Contexts are synthetic on both sides (random K/V, prefill skipped): a step's cost does not
depend on the values. The machine was shared (1-minute load average {min(load):.1f} to
{max(load):.1f} during the run), so medians are noisy; the best of the steps is the least
disturbed and is what the plot shows.

KV append is the cost of adding one token's K and V in all 30 layers: pagedllm writes it
into the token's slot of the preallocated block pool (no copy; constant in L), HF's
`DynamicCache.update` concatenates, copying the whole layer cache (linear in L; this copy is
also part of every HF decode step).

{md}

![decode step and KV append vs context length]({Path(os.path.relpath(png, Path(args.write_docs).parent)).as_posix()})
"""
        update_docs(Path(args.write_docs), body)


if __name__ == "__main__":
    main()
