"""Engine step cost versus output length: does per-step bookkeeping grow with the tokens
generated so far?

    python benchmarks/step_cost.py                       # tiny random Llama, 64 x 2000 tokens
    python benchmarks/step_cost.py --model smollm2 --output-len 500
    python benchmarks/step_cost.py --quick               # smoke test

`--num-seqs` requests (16-token prompts, `--output-len` new tokens, ignore_eos) run together
through `LLMEngine.step(stream=True)` (what the server does). Each step's timings are split as
`--debug-steps` reports them: schedule, prepare (batch tensors), forward (model, attention
included), sample (sampling metadata + sampler), output (append, detokenize, stop checks,
outputs). Printed per window of output positions: the median of each part, in ms. The
forward pass grows with context length by nature (attention reads every cached key); the
other parts should not. Two sampling setups: greedy, and penalties + logprobs (the path that
used to re-pad every sequence's output tokens each step). Writes JSON to
benchmarks/results/step_cost.json.

`--sampling-only` times just the sampling path (metadata + sampler, 64 penalised rows) at 10
and at 2,000 output tokens per sequence, without a model: quick, and it runs on older trees
too (PYTHONPATH=... to compare in one run).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from pagedllm import SamplingParams
from pagedllm.engine.llm_engine import LLMEngine

PARTS = ("schedule", "prepare", "forward", "sample", "output")


def pydoc_tokenizer():
    """A byte-level BPE of 512 tokens (<s> = 0, </s> = 1) trained on the stdlib's pydoc prose:
    a real tokenizer for random benchmark models, with no download."""
    from pydoc_data.topics import topics

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(topics.values())[:20], trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def tiny_checkpoint(path: Path) -> Path:
    """A random 2-layer Llama (hidden 64) with a byte-level vocab (`pydoc_tokenizer`)."""
    import transformers

    fast = pydoc_tokenizer()
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                   max_position_embeddings=8192, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    fast.save_pretrained(path)
    return path


def run(engine: LLMEngine, num_seqs: int, output_len: int, params: SamplingParams,
        windows: int) -> dict:
    for i in range(num_seqs):
        engine.add_request([10 + (i * 7 + j) % 400 for j in range(16)], params, f"r{i}")
    per_pos: list[dict[str, float]] = []
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step(stream=True)
        rec = engine.stats.last
        if rec.decode_seqs == num_seqs:  # a pure decode step of all sequences
            per_pos.append(dict(rec.timings_ms))
    wall = time.perf_counter() - t0
    size = max(1, len(per_pos) // windows)
    rows = []
    for w in range(0, len(per_pos) - size + 1, size):
        chunk = per_pos[w:w + size]
        row = {"positions": f"{w}-{w + size}"}
        for part in PARTS:
            row[part] = statistics.median(t.get(part, 0.0) for t in chunk)
        row["non_forward"] = sum(row[p] for p in PARTS if p != "forward")
        rows.append(row)
    return {"wall_s": wall, "decode_steps": len(per_pos), "windows": rows}


def sampling_only(num_seqs: int, output_len: int, vocab: int = 512, steps: int = 60) -> None:
    from pagedllm.core.request import Request
    from pagedllm.model.layers.sampler import (
        Sampler,
        SamplingMetadata,
        SamplingRow,
        make_generator,
    )
    try:
        from pagedllm.worker.persistent_batch import PersistentBatch
    except ImportError:  # a tree from before the persistent batch state
        PersistentBatch = None
    p = SamplingParams(temperature=0.8, repetition_penalty=1.1, frequency_penalty=0.2,
                       presence_penalty=0.1, logprobs=2, seed=1, max_tokens=10 * output_len)
    rng = random.Random(0)
    for length in (10, output_len):
        reqs = [Request(f"r{i}", list(range(16)), p, eos_token_id=None) for i in range(num_seqs)]
        for r in reqs:
            r.generators = [make_generator(1, "cpu")]
            for _ in range(length):
                r.append_token(rng.randrange(vocab))
        state = PersistentBatch(vocab, torch.device("cpu")) if PersistentBatch else None
        sampler, logits, times = Sampler(), torch.randn(num_seqs, vocab), []
        for _ in range(steps):
            for r in reqs:
                r.append_token(rng.randrange(vocab))
            t0 = time.perf_counter()
            rows = [SamplingRow(r.sampling_params, r.prompt_token_ids, r.output_token_ids,
                                r.generator) for r in reqs]
            if state is not None:
                state.begin_step()
                md = SamplingMetadata.build(rows, vocab, "cpu", state.penalty_tensors(reqs))
            else:
                md = SamplingMetadata.build(rows, vocab, "cpu")
            sampler(logits, md)
            times.append(time.perf_counter() - t0)
        print(f"sampling, {num_seqs} penalised rows at {length} output tokens: "
              f"{1e3 * statistics.median(times):.2f} ms per step "
              f"({'persistent' if state is not None else 'lists'})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="tiny (random 2-layer Llama), smollm2 "
                    "(the default model) or a model path")
    ap.add_argument("--num-seqs", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=2000)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--num-threads", type=int, default=1)
    ap.add_argument("--int8-activations", action=argparse.BooleanOptionalAction, default=None,
                    help="a GGUF model's int8-activation kernels on / off (default: the "
                    "engine's choice for this CPU, as `pagedllm serve` makes it)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sampling-only", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/step_cost.json")
    args = ap.parse_args()
    if args.quick:
        args.num_seqs, args.output_len, args.windows = 8, 64, 2
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.num_threads)
    if args.sampling_only:
        sampling_only(args.num_seqs, args.output_len)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = {"tiny": lambda: str(tiny_checkpoint(Path(tmp))), "smollm2": lambda: None
                 }.get(args.model, lambda: args.model)()
        engine = LLMEngine.from_engine_args(
            model=model, num_threads=args.num_threads, max_num_seqs=args.num_seqs,
            max_model_len=16 + args.output_len,
            kv_cache_memory=args.num_seqs * (16 + args.output_len) * 2048 + 2**24,
            int8_activations=args.int8_activations)
        setups = {
            "greedy": SamplingParams(temperature=0.0, max_tokens=args.output_len,
                                     ignore_eos=True),
            "penalties+logprobs": SamplingParams(
                temperature=0.8, max_tokens=args.output_len, ignore_eos=True,
                repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.1,
                logprobs=2, seed=1),
        }
        engine.add_request([5] * 16, SamplingParams(max_tokens=4), "warmup")
        while engine.has_unfinished_requests():
            engine.step()
        results = {name: run(engine, args.num_seqs, args.output_len, p, args.windows)
                   for name, p in setups.items()}
    cpu = sorted({f for f in Path("/proc/cpuinfo").read_text().split()
                  if f.startswith("avx512") or f == "avx2"}) if Path("/proc/cpuinfo").exists() else []
    meta = {"model": args.model, "num_seqs": args.num_seqs, "output_len": args.output_len,
            "num_threads": args.num_threads, "cpu_flags": cpu, "machine": platform.processor(),
            "torch": torch.__version__}
    for name, res in results.items():
        print(f"\n{name}: {res['decode_steps']} decode steps of {args.num_seqs} sequences, "
              f"{res['wall_s']:.1f} s (median ms per step)")
        print("| output positions | " + " | ".join(PARTS) + " | all but forward |")
        print("|---" * (len(PARTS) + 2) + "|")
        for row in res["windows"]:
            print(f"| {row['positions']} | " + " | ".join(f"{row[p]:.2f}" for p in PARTS)
                  + f" | {row['non_forward']:.2f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
