"""Perplexity of pagedllm's weight formats on held-out text (`pydoc_data.topics`), one run.

    python benchmarks/perplexity.py [--model M.gguf] [--formats none,gguf,gguf-a8,int8,w8a8]
                                    [--windows 8]

The text is cut into non-overlapping windows of `--window` tokens; each window is one
prefill through the engine's own model (paged KV cache, the real kernels of the format),
and every position's logits score the next token. The formats are `--quantization` values:
`none` (dequantized fp32), `gguf` (the GGUF's blocks kept quantized: by construction the same
weight values as none, so the same perplexity up to summation order), `int8` (weight-only
int8 made at load), `w8a8` (`--quantization int8 --int8-activations`: int8 weights and
dynamic int8 activations, a scale per 32 values), and `gguf-a8` (the GGUF's blocks with
`--int8-activations`: activations quantized per 32 values, llama.cpp's scheme; prefill runs
int8 too for Q8_0 / Q4_0 / Q4_1 blocks, so the windows measure its error). A format the build
does not offer is reported as unavailable.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pagedllm import LLM  # noqa: E402
from pagedllm.core.scheduler_output import ScheduledRequest  # noqa: E402
from pagedllm.kernels import cpu_features  # noqa: E402
from pagedllm.model.layers.quant import prompt_rows  # noqa: E402
from pagedllm.worker.input_batch import build_inputs  # noqa: E402


def heldout_tokens(tokenizer, windows: int, window: int) -> list[list[int]]:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    ids = tokenizer.encode(text)
    out = [ids[i:i + window] for i in range(0, len(ids) - window, window)]
    return out[:windows]


@torch.inference_mode()
def window_nll(llm: LLM, tokens: list[int]) -> tuple[float, int]:
    """Summed next-token NLL over one window, computed as a single prefill of the engine's
    model into blocks 0.. of its KV pool (the engine is idle)."""
    engine = llm.llm_engine
    bs = engine.config.block_size
    nblocks = -(-len(tokens) // bs)
    if nblocks > engine.num_blocks:
        raise ValueError(f"window of {len(tokens)} tokens needs {nblocks} KV blocks, the pool "
                         f"has {engine.num_blocks}")
    request = SimpleNamespace(num_computed_tokens=0, all_token_ids=tokens,
                              block_ids=list(range(nblocks)))
    sched = [ScheduledRequest(request, len(tokens))]
    batch = build_inputs(sched, bs, engine.runner.attention_backend)
    # every row is a prompt position: on the GGUF panels' bf16 tiles where the engine runs
    # prompts there (PAGEDLLM_PROMPT_TILES; a model with such matrices), as
    # worker/model_runner.py scopes a step
    on_tiles = engine.runner.prompt_tiles_apply and cpu_features.prompt_tiles_on()
    rows = prompt_rows.PromptRows(len(tokens), matrices=cpu_features.prompt_matrix_tiles_on())
    scope = prompt_rows.step_scope(rows) if on_tiles else contextlib.nullcontext()
    with scope:
        hidden = engine.model(batch.input_ids, batch.positions, batch.max_pos,
                              engine.cache.layer_caches, batch.meta)
    logits = engine.model.compute_logits(hidden[:-1]).double()
    target = torch.tensor(tokens[1:])
    nll = -(logits.log_softmax(-1).gather(1, target[:, None])).sum().item()
    return nll, len(tokens) - 1


def measure(model: str | None, fmt: str, windows: int, window: int, threads: int) -> dict:
    t0 = time.perf_counter()
    # "w8a8": int8 weights and dynamic per-32 int8 activations (--int8-activations);
    # "gguf-a8": the GGUF's blocks with int8 activations; "gguf" and "int8" the exact
    # activations (int8 activations are the default on VNNI CPUs: kernels/cpu_features.py)
    quant, extra = {"w8a8": ("int8", {"int8_activations": True}),
                    "gguf-a8": ("gguf", {"int8_activations": True})}.get(
                        fmt, (fmt, {"int8_activations": False}))
    try:
        llm = LLM(model, quantization=quant, max_model_len=window, num_threads=threads,
                  kv_cache_memory=2 * window * 64 * 1024, max_num_seqs=1, **extra)
    except (ValueError, NotImplementedError) as exc:
        return {"format": fmt, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    from pagedllm.worker.model_setup import weight_bytes

    load_s = time.perf_counter() - t0
    held = {m.quant.format for m in llm.llm_engine.model.modules()
            if getattr(m, "quant", None) is not None}
    if quant != "none" and not any(quant in f for f in held):
        return {"format": fmt, "error": f"not implemented in this build (weights held: "
                f"{sorted(held) or 'dense'})"}
    chunks = heldout_tokens(llm.get_tokenizer(), windows, window)
    total, count = 0.0, 0
    t0 = time.perf_counter()
    for chunk in chunks:
        nll, n = window_nll(llm, chunk)
        total, count = total + nll, count + n
    res = {"format": fmt, "perplexity": math.exp(total / count), "tokens": count,
           "windows": len(chunks), "window": window, "weight_bytes": weight_bytes(llm.llm_engine.model),
           "load_s": load_s, "score_s": time.perf_counter() - t0}
    del llm
    gc.collect()
    return res


def table(rows: list[dict]) -> str:
    base = next((r["perplexity"] for r in rows if r.get("format") == "none" and
                 "perplexity" in r), None)
    lines = ["| --quantization | perplexity | vs none | weights (MiB) | scored tokens |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        if "perplexity" not in r:
            lines.append(f"| {r['format']} | unavailable: {r['error']} | | | |")
            continue
        rel = f"{r['perplexity'] / base:.4f}" if base else "—"
        lines.append(f"| {r['format']} | {r['perplexity']:.4f} | {rel} | "
                     f"{r['weight_bytes'] / 2**20:.1f} | {r['tokens']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct Q4_1 GGUF")
    ap.add_argument("--formats", default="none,gguf,gguf-a8,int8,w8a8")
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args(argv)
    rows = [measure(args.model, f, args.windows, args.window, args.threads)
            for f in args.formats.split(",") if f]
    print(table(rows))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"rows": rows, "text": "pydoc_data.topics", "numpy": np.__version__}
    (out / "perplexity.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
