"""LoRA / QLoRA fine-tuning on SmolLM2-135M-Instruct (the default model, fp32 weights).

    python benchmarks/finetune.py                  # full: 10 timed steps per mode, 200-step task
    python benchmarks/finetune.py --quick          # smoke test: 2 timed steps, 3-step task

1. Training cost, one child process per mode (so each peak RSS is its own): plain LoRA,
   LoRA + gradient checkpointing, QLoRA (NF4 base) + checkpointing. Reports tokens/s, peak
   RSS, bytes autograd holds for backward after one forward (saved-tensor hooks), base
   weight bytes. Same run, same batches: only the ratios between modes mean anything.
2. A held-out task from `pydoc_data.topics`: "which documentation topic is this paragraph
   from?" over 8 topics (chat messages; loss only on the answer). Trains --steps steps,
   eval loss before/after on held-out paragraphs, then serves the adapter with
   `pagedllm serve --enable-lora --lora-modules pydoc-topics=ADAPTER` and scores greedy
   answers (`/v1/chat/completions`) on the held-out paragraphs through the base model's name
   and through the adapter's.

Prints a table, writes benchmarks/results/finetune.json and the loss curve PNG.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

logger = logging.getLogger("benchmarks.finetune")
TOPICS = ["specialnames", "compound", "types", "formatstrings", "string-methods", "debugger",
          "assignment", "import"]
MODES = {"lora": {}, "lora+ckpt": {"gradient_checkpointing": True},
         "qlora+ckpt": {"qlora": True, "gradient_checkpointing": True}}


def task_rows(per_topic_train: int, per_topic_eval: int, chars: int = 360
              ) -> tuple[list[dict], list[dict]]:
    """(train, eval) chat examples: a paragraph of a topic -> the topic's name."""
    from pydoc_data.topics import topics

    question = ("Which Python documentation topic is this paragraph from? Answer with one "
                "of: " + ", ".join(TOPICS) + ".\n\n")
    train, evals = [], []
    for topic in TOPICS:
        paras = [" ".join(p.split())[:chars] for p in topics[topic].split("\n\n")
                 if len(p) > 200]
        random.Random(topic).shuffle(paras)
        rows = [{"messages": [{"role": "user", "content": question + p},
                              {"role": "assistant", "content": topic}]} for p in paras]
        evals += rows[:per_topic_eval]
        train += rows[per_topic_eval:per_topic_eval + per_topic_train]
    random.Random(0).shuffle(train)
    return train, evals


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def child(args) -> None:
    """One training run in this process; prints its numbers as JSON on the last line."""
    import torch

    from pagedllm.finetune import FinetuneConfig, Trainer
    from pagedllm.finetune.data import collate
    from pagedllm.finetune.memory import SavedActivationMeter

    torch.set_num_threads(args.threads)
    spec = json.loads(args.child)
    cfg = FinetuneConfig(base=args.base, data=spec["data"], eval_data=spec.get("eval"),
                         out=spec["out"], max_steps=spec["steps"], lr=args.lr,
                         batch_size=args.batch_size, lora_r=args.lora_r,
                         lora_alpha=2.0 * args.lora_r, target_modules="all-linear",
                         max_seq_len=args.max_seq_len, progress=False, dtype=args.dtype,
                         **spec.get("mode", {}))
    trainer = Trainer(cfg)
    batch = collate(trainer.train_data[:args.batch_size])
    trainer.model.train()
    with SavedActivationMeter(exclude=trainer.base_params) as meter:
        loss = trainer.loss_sum(batch)
    loss.backward()
    for p in trainer.params:
        p.grad = None
    t0 = time.perf_counter()
    result = trainer.train()
    wall = time.perf_counter() - t0
    print(json.dumps({
        "tokens_per_s": result.tokens_per_s, "wall_s": wall, "steps": result.steps,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "saved_for_backward_mib": meter.bytes / 2**20,
        "base_weight_mib": result.base_weight_bytes / 2**20,
        "lora_parameters": result.lora_parameters, "loss_first": result.losses[0],
        "loss_last": result.losses[-1], "eval_before": result.eval_before,
        "eval_after": result.eval_after}))


def run_child(args, spec: dict) -> dict:
    cmd = [sys.executable, __file__, "--child", json.dumps(spec), "--base", args.base,
           "--threads", str(args.threads), "--lr", str(args.lr), "--batch-size",
           str(args.batch_size), "--lora-r", str(args.lora_r), "--max-seq-len",
           str(args.max_seq_len), "--dtype", args.dtype]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"child failed: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def served_accuracy(base_url: str, model: str, rows: list[dict]) -> float:
    """Greedy answers over HTTP (`/v1/chat/completions`, 8 requests in flight) scored
    against each row's topic."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    def answer(row: dict) -> bool:
        r = httpx.post(f"{base_url}/v1/chat/completions", timeout=300.0, json={
            "model": model, "messages": row["messages"][:1], "temperature": 0.0,
            "max_tokens": 8})
        r.raise_for_status()
        text = r.json()["choices"][0]["message"]["content"].strip()
        return (text.split()[0].strip(".") if text else "") == row["messages"][1]["content"]

    with ThreadPoolExecutor(8) as pool:
        return sum(pool.map(answer, rows)) / len(rows)


def serve_and_score(args, adapter: Path, rows: list[dict], log: Path) -> dict:
    """`pagedllm serve BASE --enable-lora --lora-modules pydoc-topics=ADAPTER`, then the
    held-out accuracy through the base model's name and through the adapter's."""
    import httpx

    from pagedllm.entrypoints.launcher import ServerProcess, free_port

    port = free_port()
    cmd = [sys.executable, "-m", "pagedllm.entrypoints.cli", "serve", args.base, "--port",
           str(port), "--num-threads", str(args.threads), "--enable-lora", "--lora-modules",
           f"pydoc-topics={adapter}", "--max-lora-rank", str(args.lora_r),
           "--max-model-len", "1024", "--disable-access-log"]
    with ServerProcess(cmd, port, log) as srv:
        srv.wait_ready(300.0)
        models = httpx.get(f"{srv.base_url}/v1/models").json()["data"]
        base = next(m["id"] for m in models if m.get("parent") is None)
        return {"served_models": [m["id"] for m in models],
                "served_accuracy_base": served_accuracy(srv.base_url, base, rows),
                "served_accuracy_adapter": served_accuracy(srv.base_url, "pydoc-topics", rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=None, help="task steps (default 200)")
    ap.add_argument("--timed-steps", type=int, default=None, help="steps per mode (10)")
    ap.add_argument("--base", default=None, help="HF dir (default: SmolLM2's fp32 dir)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--max-seq-len", type=int, default=192)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default="benchmarks/results/finetune.json")
    ap.add_argument("--curve", default="docs/img/finetune_loss.png")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        logging.basicConfig(level=logging.WARNING)
        child(args)
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.base is None:
        from pagedllm.loader import hf_reference_dir

        args.base = str(hf_reference_dir(None))
    steps = args.steps or (3 if args.quick else 200)
    timed = args.timed_steps or (2 if args.quick else 10)
    tmp = Path(tempfile.mkdtemp(prefix="ft_bench_"))
    train, evals = task_rows(16, 4)
    data = write_jsonl(tmp / "train.jsonl", train)
    evalf = write_jsonl(tmp / "eval.jsonl", evals)
    flags = sorted(set(Path("/proc/cpuinfo").read_text().split()) & {
        "avx2", "avx512f", "avx512_bf16", "amx_bf16"}) if Path("/proc/cpuinfo").exists() else []
    res = {"machine": platform.processor() or platform.machine(), "cpu_flags": flags,
           "threads": args.threads, "base": args.base, "batch_size": args.batch_size,
           "lora_r": args.lora_r, "targets": "all-linear", "dtype": args.dtype,
           "train_examples": len(train), "eval_examples": len(evals), "modes": {}}
    for name, mode in MODES.items():
        logger.info("mode %s: %d steps", name, timed)
        res["modes"][name] = run_child(args, {"data": str(data), "out": str(tmp / name),
                                              "steps": timed, "mode": mode})
        logger.info("%s: %s", name, json.dumps(res["modes"][name]))
    logger.info("task: %d steps", steps)
    adapter = tmp / "task_adapter"
    res["task"] = run_child(args, {"data": str(data), "eval": str(evalf), "out": str(adapter),
                                   "steps": steps})
    logger.info("task: %s", json.dumps(res["task"]))
    if Path(args.curve).parent.is_dir():
        shutil.copy(adapter / "loss_curve.png", args.curve)
    res["task"].update(serve_and_score(args, adapter, evals, tmp / "serve.log"))
    res["task"]["steps"] = steps
    Path(args.out).write_text(json.dumps(res, indent=2))
    base_tps = res["modes"]["lora"]["tokens_per_s"]
    print(f"\nSmolLM2-135M, batch {args.batch_size}, r={args.lora_r} all-linear, "
          f"{args.threads} threads, flags {' '.join(flags)}")
    print(f"{'mode':<12} {'tokens/s':>9} {'ratio':>6} {'peak RSS MiB':>13} "
          f"{'saved for bwd MiB':>18} {'base weights MiB':>17}")
    for name, m in res["modes"].items():
        print(f"{name:<12} {m['tokens_per_s']:>9.1f} {m['tokens_per_s'] / base_tps:>6.2f} "
              f"{m['peak_rss_mib']:>13.0f} {m['saved_for_backward_mib']:>18.1f} "
              f"{m['base_weight_mib']:>17.1f}")
    t = res["task"]
    print(f"\ntask ({steps} steps, {len(train)} train / {len(evals)} held-out paragraphs): eval "
          f"loss {t['eval_before']:.3f} -> {t['eval_after']:.3f}; served greedy accuracy "
          f"{t['served_accuracy_base']:.2f} (base) -> {t['served_accuracy_adapter']:.2f} "
          f"(adapter)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
