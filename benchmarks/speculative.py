"""Speculative decoding: output tok/s with and without it, same run, on a copy-heavy workload
(rewrite a held-out paragraph with a name changed; edit a function of the standard library)
and a chat workload (open questions), single stream and 8 streams.

    python benchmarks/speculative.py                      # SmolLM2-135M-Instruct, n-gram k=4
    python benchmarks/speculative.py --quick              # fewer prompts, shorter outputs
    python benchmarks/speculative.py --speculative-config '{"method": "draft_model", ...}'

Greedy decoding, so both engines emit the same tokens. Each cell alternates the engines
(base, spec, base, spec, ... `--rounds` times) and reports the median of the per-round
ratios. Acceptance rate = accepted / proposed draft tokens; mean accepted length = tokens
emitted per verification. Reach (issue 16): copy-heavy single stream >= 1.8x, no workload
below 0.95x. Prints a table and writes JSON to benchmarks/results/spec_decode.json.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import platform
import re
import statistics
import time
from pathlib import Path

from pagedllm import LLM, SamplingParams

logger = logging.getLogger("benchmarks.speculative")

NAMES = [("Python", "Cobra"), ("function", "routine"), ("object", "thing"),
         ("module", "package"), ("statement", "command"), ("value", "datum"),
         ("class", "kind"), ("list", "array")]
QUESTIONS = [
    "What is the capital of France, and what is it known for?",
    "Give me three tips for sleeping better.",
    "Explain what a hash table is to a beginner.",
    "Write a short poem about the sea.",
    "Why is the sky blue?",
    "How do I make a cup of green tea?",
    "What are the benefits of regular exercise?",
    "Describe a good morning routine.",
]


def copy_heavy_prompts(n: int) -> list[list[dict]]:
    """Rewrite-with-a-change requests over held-out text and standard-library code."""
    import textwrap
    from pydoc_data.topics import topics

    paragraphs = [p for t in topics.values() for p in t.split("\n\n")
                  if 350 < len(p) < 700 and p.count(NAMES[0][0]) + p.count("object") > 0]
    import json as json_mod
    import string
    funcs = [textwrap.dedent(inspect.getsource(f)) for f in (
        string.capwords, json_mod.dumps, textwrap.indent, statistics.median)]
    out = []
    for i in range(n):
        if i % 2 == 0:
            text = re.sub(r"\s+", " ", paragraphs[(7 * i) % len(paragraphs)]).strip()
            old, new = NAMES[i % len(NAMES)]
            msg = (f'Rewrite the following paragraph exactly, but replace the word "{old}" '
                   f'with "{new}" everywhere.\n\n{text}')
        else:
            code = funcs[(i // 2) % len(funcs)][:900]
            msg = ("Rewrite this Python code exactly, but rename the first parameter to "
                   f"`value`. Output only the code.\n\n```python\n{code}\n```")
        out.append([{"role": "user", "content": msg}])
    return out


def chat_prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(n)]


def timed(llm: LLM, prompts: list[list[int]], streams: int, max_tokens: int) -> dict:
    """Generate for all prompts, `streams` at a time; output tokens per second."""
    sp = SamplingParams(temperature=0, max_tokens=max_tokens)
    sd = llm.llm_engine.stats.speculative
    before = (sd.num_drafts, sd.num_draft_tokens, sd.num_accepted_tokens) if sd else None
    n_out, t0 = 0, time.perf_counter()
    outs = []
    for i in range(0, len(prompts), streams):
        batch = llm.generate(prompts[i:i + streams], sp, use_tqdm=False)
        outs += batch
        n_out += sum(len(o.outputs[0].token_ids) for o in batch)
    dt = time.perf_counter() - t0
    # Per-stream decode rate: tokens after the first over first token -> finish (prefill
    # excluded; speculation only speeds up decoding).
    dec_s = sum(o.metrics.finished_time - o.metrics.first_token_time for o in outs)
    dec_n = sum(len(o.outputs[0].token_ids) - 1 for o in outs)
    res = {"seconds": dt, "output_tokens": n_out, "tok_s": n_out / dt,
           "decode_tok_s": dec_n / dec_s if dec_s > 0 else 0.0,
           "tokens": [o.outputs[0].token_ids for o in outs]}
    if sd is not None:
        drafts, proposed, accepted = (a - b for a, b in zip(
            (sd.num_drafts, sd.num_draft_tokens, sd.num_accepted_tokens), before, strict=True))
        res |= {"drafts": drafts, "draft_tokens": proposed, "accepted": accepted}
    return res


def cell(base: LLM, spec: LLM, prompts, streams: int, max_tokens: int, rounds: int) -> dict:
    ratios, b_runs, s_runs = [], [], []
    for _ in range(rounds):
        b = timed(base, prompts, streams, max_tokens)
        s = timed(spec, prompts, streams, max_tokens)
        if b["tokens"] != s["tokens"]:
            logger.warning("greedy outputs differ between the engines (streams=%d)", streams)
        ratios.append(s["tok_s"] / b["tok_s"])
        b_runs.append(b)
        s_runs.append(s)
    proposed = sum(r["draft_tokens"] for r in s_runs)
    accepted = sum(r["accepted"] for r in s_runs)
    drafts = sum(r["drafts"] for r in s_runs)
    return {"streams": streams, "base_tok_s": statistics.median(r["tok_s"] for r in b_runs),
            "spec_tok_s": statistics.median(r["tok_s"] for r in s_runs),
            "speedup": statistics.median(ratios), "ratios": ratios,
            "base_decode_tok_s": statistics.median(r["decode_tok_s"] for r in b_runs),
            "spec_decode_tok_s": statistics.median(r["decode_tok_s"] for r in s_runs),
            "acceptance_rate": accepted / proposed if proposed else 0.0,
            "mean_accepted_length": 1 + accepted / drafts if drafts else 1.0,
            "output_tokens": s_runs[0]["output_tokens"],
            "draft_tokens_per_output_token": proposed / sum(r["output_tokens"] for r in s_runs),
            "identical": all(
                b["tokens"] == s["tokens"] for b, s in zip(b_runs, s_runs, strict=True))}


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    return " ".join(sorted(set(re.findall(r"avx512[a-z_]*|avx2", text))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct (GGUF)")
    ap.add_argument("--speculative-config", default='{"method": "ngram", '
                    '"num_speculative_tokens": 4, "prompt_lookup_max": 4, '
                    '"prompt_lookup_min": 2}')
    ap.add_argument("--num-prompts", type=int, default=8, help="prompts per workload")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", default="1,8")
    ap.add_argument("--workloads", default="copy,chat")
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--quantization", default=None,
                    help="none: fp32 weights (default: the checkpoint's, GGUF Q4 for SmolLM2)")
    ap.add_argument("--quick", action="store_true", help="2 prompts, 64 tokens, 1 round")
    ap.add_argument("--out", default="benchmarks/results/spec_decode.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.quick:
        args.num_prompts, args.max_tokens, args.rounds = 2, 64, 1
    # Prefix caching off: every round re-runs the same prompts, and a cached prefix would let
    # later rounds skip the prefill that a user with new prompts pays.
    common = {"num_threads": args.num_threads, "max_model_len": 2048,
              "kv_cache_memory": "1GiB", "quantization": args.quantization,
              "enable_prefix_caching": False}
    base = LLM(args.model, **common)
    spec = LLM(args.model, speculative_config=args.speculative_config, **common)
    tok = base.get_tokenizer()
    workloads = {"copy": copy_heavy_prompts, "chat": chat_prompts}
    rows = []
    for name in args.workloads.split(","):
        convs = workloads[name](args.num_prompts)
        prompts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
                   for c in convs]
        for streams in (int(s) for s in args.streams.split(",")):
            n = max(streams, args.num_prompts)
            r = cell(base, spec, (prompts * n)[:n], streams, args.max_tokens, args.rounds)
            r["workload"] = name
            rows.append(r)
            logger.info("%s streams=%d: %.1f -> %.1f tok/s (%.2fx; per-stream decode %.1f -> "
                        "%.1f), acceptance %.2f, mean accepted length %.2f, %.2f draft tokens "
                        "per output token", name, streams, r["base_tok_s"], r["spec_tok_s"],
                        r["speedup"], r["base_decode_tok_s"], r["spec_decode_tok_s"],
                        r["acceptance_rate"], r["mean_accepted_length"],
                        r["draft_tokens_per_output_token"])
    print(f"\n{'workload':<10}{'streams':>8}{'base tok/s':>12}{'spec tok/s':>12}"
          f"{'speedup':>9}{'decode x':>10}{'accept':>8}{'mean len':>10}{'same':>6}")
    for r in rows:
        dec = r["spec_decode_tok_s"] / r["base_decode_tok_s"] if r["base_decode_tok_s"] else 0
        print(f"{r['workload']:<10}{r['streams']:>8}{r['base_tok_s']:>12.1f}"
              f"{r['spec_tok_s']:>12.1f}{r['speedup']:>8.2f}x{dec:>9.2f}x"
              f"{r['acceptance_rate']:>8.2f}{r['mean_accepted_length']:>10.2f}"
              f"{'yes' if r['identical'] else 'NO':>6}")
    result = {"model": args.model or "SmolLM2-135M-Instruct (GGUF)",
              "speculative_config": json.loads(args.speculative_config),
              "max_tokens": args.max_tokens, "rounds": args.rounds,
              "num_prompts": args.num_prompts, "num_threads": args.num_threads,
              "quantization": args.quantization,
              "cpu_flags": cpu_flags(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
