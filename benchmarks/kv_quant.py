"""KV cache dtypes: accuracy, capacity and speed of float16 / int8 / fp8 caches vs fp32, one run.

    python benchmarks/kv_quant.py                 # default model, ~10 minutes on 2 CPUs
    python benchmarks/kv_quant.py --quick         # small sizes, smoke test

One engine per `--kv-cache-dtype` (float32, float16, int8, fp8_e4m3, fp8_e5m2), all loaded at once and
stepped in lockstep (one step of each in turn), so that a shared machine's load falls on
all of them alike. For each:

  * perplexity of `--segments` x `--segment-len` tokens of held-out prose (the stdlib's
    pydoc_data.topics), teacher-forced through the engine: each sequence starts as a
    one-token prompt, and after every step the runner's sampled token is replaced by the
    text's next token, whose log-probability is read from the same logits. So every scored
    token after the first comes from a decode step whose attention reads the whole context
    through the paged (quantized) cache, K/V written by the engine itself;
  * greedy agreement: `--prompts` prompts x `--gen-len` greedy tokens, the fraction of
    positions where the token equals float32's, and the mean number of tokens before the
    first difference;
  * capacity: tokens that fit in the 2 GiB default CPU budget (KVCacheSpec, what the
    engine's start-up log reports);
  * decode throughput: tokens per second of the decode-only steps of both workloads
    (whole `LLMEngine.step()`), and the decode attention kernel alone at long contexts.

Prints markdown tables and writes JSON to benchmarks/results/kv_quant.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from pagedllm import SamplingParams
from pagedllm.config import KVCacheSpec
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.kernels import cpu_ops
from pagedllm.model.layers import kv_quant

logger = logging.getLogger("benchmarks.kv_quant")

# float32 is the reference (exact K/V); "auto" is float16 where int8 activations are on
# (EngineConfig.resolve_kv_cache_dtype), so it is not listed apart.
REF = "float32"
DTYPES = (REF, "float16", "int8", "fp8_e4m3", "fp8_e5m2")
BUDGET = 2 * 2**30


def prose_tokens(tokenizer) -> list[int]:
    from pydoc_data.topics import topics

    return tokenizer.encode("\n\n".join(topics.values()))


class TeacherForcing:
    """Make `engine` generate a given text: each sampled token is replaced by the text's next
    token, and that token's logprob (from the step's logits) is recorded per request."""

    def __init__(self, engine: LLMEngine) -> None:
        self.texts: dict[str, list[int]] = {}
        self.logprobs: dict[str, list[float]] = {}
        runner, model = engine.runner, engine.runner.model
        compute_logits, execute = model.compute_logits, runner.execute
        step_rows: list[torch.Tensor] = []

        def capture(hidden: torch.Tensor) -> torch.Tensor:
            logits = compute_logits(hidden)
            step_rows.append(torch.log_softmax(logits.float(), dim=-1))
            return logits

        def forced(sched):
            step_rows.clear()
            out = execute(sched)
            if out.sampled:
                (logp,) = step_rows      # one row per sampling request (n = 1), same order
                for row, st in enumerate(out.sampled):
                    req = st.request
                    target = self.texts[req.request_id][req.num_tokens]
                    self.logprobs[req.request_id].append(float(logp[row, target]))
                    st.token_ids = [target]
            return out

        model.compute_logits = capture
        runner.execute = forced

    def add(self, engine: LLMEngine, rid: str, text: list[int]) -> None:
        self.texts[rid] = text
        self.logprobs[rid] = []
        engine.add_request(text[:1], SamplingParams(temperature=0.0, max_tokens=len(text) - 1,
                                                    ignore_eos=True), request_id=rid)


def run_lockstep(engines: dict[str, LLMEngine]) -> dict[str, dict]:
    """Step every engine in turn until all are done. Per engine: finished outputs by request
    id, and the time and tokens of its decode-only steps."""
    res = {name: {"outputs": {}, "decode_s": 0.0, "decode_tokens": 0, "decode_steps": 0}
           for name in engines}
    last: dict[str, object] = {}
    for name, eng in engines.items():
        schedule = eng.scheduler.schedule

        def recording(schedule=schedule, name=name):
            last[name] = schedule()
            return last[name]

        eng.scheduler.schedule = recording
    while any(e.has_unfinished_requests() for e in engines.values()):
        for name, eng in engines.items():
            if not eng.has_unfinished_requests():
                continue
            t0 = time.perf_counter()
            outs = eng.step()
            dt = time.perf_counter() - t0
            sched = last[name]
            if sched.scheduled and all(s.num_new_tokens == 1 for s in sched.scheduled):
                r = res[name]
                r["decode_s"] += dt
                r["decode_tokens"] += len(sched.scheduled)
                r["decode_steps"] += 1
            for o in outs:
                if o.finished:
                    res[name]["outputs"][o.request_id] = o
    for name, eng in engines.items():
        del eng.scheduler.schedule
        r = res[name]
        r["decode_tok_s"] = r["decode_tokens"] / r["decode_s"] if r["decode_s"] else 0.0
    return res


def perplexity(engines: dict[str, LLMEngine], segments: list[list[int]]) -> dict[str, dict]:
    forcers = {name: TeacherForcing(eng) for name, eng in engines.items()}
    for name, eng in engines.items():
        for i, seg in enumerate(segments):
            forcers[name].add(eng, f"ppl{i}", seg)
    timing = run_lockstep(engines)
    ref = [lp for i in range(len(segments)) for lp in forcers[REF].logprobs[f"ppl{i}"]]
    out = {}
    for name in engines:
        lps = [lp for i in range(len(segments)) for lp in forcers[name].logprobs[f"ppl{i}"]]
        assert len(lps) == sum(len(s) - 1 for s in segments), "every token must be scored"
        out[name] = {"scored_tokens": len(lps), "ppl": math.exp(-statistics.fmean(lps)),
                     "mean_abs_logprob_diff_vs_ref": statistics.fmean(
                         abs(a - b) for a, b in zip(lps, ref, strict=True)),
                     "decode_tok_s": timing[name]["decode_tok_s"],
                     "decode_steps": timing[name]["decode_steps"],
                     "batch": len(segments)}
    for name in engines:
        engines[name].runner.__dict__.pop("execute", None)
        engines[name].runner.model.__dict__.pop("compute_logits", None)
    return out


def greedy_agreement(engines: dict[str, LLMEngine], prompts: list[list[int]],
                     gen_len: int) -> dict[str, dict]:
    """Position-wise agreement with float32's greedy tokens, and how close float32's own
    choice was where a sequence first differs (its logprob gap to the other token, if in its
    top 5)."""
    params = SamplingParams(temperature=0.0, max_tokens=gen_len, ignore_eos=True, logprobs=5)
    for eng in engines.values():
        for i, p in enumerate(prompts):
            eng.add_request(p, params, request_id=f"greedy{i}")
    timing = run_lockstep(engines)
    outs = {name: [timing[name]["outputs"][f"greedy{i}"].outputs[0]
                   for i in range(len(prompts))] for name in engines}
    out = {}
    for name in engines:
        same = prefix = 0
        gaps = []
        for ref, got in zip(outs[REF], outs[name], strict=True):
            a, b = ref.token_ids, got.token_ids
            same += sum(x == y for x, y in zip(a, b, strict=True))
            first = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y),
                         None)
            prefix += len(a) if first is None else first
            if first is not None:
                top = ref.logprobs[first]
                other = top.get(b[first])
                gaps.append(top[a[first]].logprob - other.logprob if other else math.inf)
        finite = [g for g in gaps if g != math.inf]
        out[name] = {"agreement": same / (len(prompts) * gen_len),
                     "mean_tokens_before_first_difference": prefix / len(prompts),
                     "identical_sequences": len(prompts) - len(gaps),
                     "first_differences_in_ref_top5": len(finite),
                     "median_ref_gap_at_first_difference": (
                         statistics.median(finite) if finite else None),
                     "decode_tok_s": timing[name]["decode_tok_s"],
                     "decode_steps": timing[name]["decode_steps"], "batch": len(prompts)}
    return out


def attention_kernel(spec: KVCacheSpec, dtypes: dict[str, torch.dtype], batch: int,
                     context: int, reps: int) -> dict[str, dict] | None:
    """One layer's C++ decode attention over `batch` x `context` tokens per cache dtype,
    timed in turns (one call of each dtype per round): median and best ms."""
    ops = cpu_ops.load()
    if ops is None:
        return None
    bs, kvh, d = spec.block_size, spec.num_kv_heads, spec.head_dim
    nb = batch * (-(-context // bs))
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(nb, bs, kvh, d, generator=g) for _ in range(2)]
    bt = torch.randperm(nb, generator=g).view(batch, -1).contiguous()
    lens = torch.full((batch,), context, dtype=torch.int64)
    q = torch.randn(batch, kvh * 3, d, generator=g)
    out = torch.empty_like(q)
    calls = {}
    for name, dtype in dtypes.items():
        if kv_quant.is_quantized(dtype):
            (k, ks), (v, vs) = (kv_quant.quantize(t, dtype) for t in x)
            calls[name] = functools.partial(ops.paged_decode_attention_quant, out, q, k, v, ks,
                                            vs, bt, lens, d**-0.5, 0)
        else:  # fp32, or float16 rows
            calls[name] = functools.partial(ops.paged_decode_attention, out, q,
                                            *(t.to(dtype) for t in x), bt, lens, d**-0.5, 0)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(reps + 1):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: {"median_ms": 1e3 * statistics.median(t[1:]), "best_ms": 1e3 * min(t[1:])}
            for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: the run stays under ~10 minutes on a shared 2-CPU "
                    "machine; accuracy numbers do not depend on it)")
    ap.add_argument("--segments", type=int, default=8)
    ap.add_argument("--segment-len", type=int, default=384)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--kernel-contexts", default="1x2048,1x8192,8x2048,8x8192")
    ap.add_argument("--kv-cache-memory", default="512MiB", help="pool of each engine")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    ap.add_argument("--out", default="benchmarks/results/kv_quant.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.quick:
        args.segments, args.segment_len, args.prompts, args.gen_len = 2, 32, 4, 16
        args.kernel_contexts = "1x512"
    t_start = time.perf_counter()
    engines = {}
    for name in DTYPES:
        # The same byte budget for all (the quantized caches get more blocks); the default
        # holds every sequence of both workloads at once in fp32, so nothing is preempted.
        engines[name] = LLMEngine.from_engine_args(
            model=args.model, num_threads=args.threads, kv_cache_dtype=name,
            max_num_seqs=max(args.segments, args.prompts), kv_cache_memory=args.kv_cache_memory,
            enable_prefix_caching=False)
    eng = engines[REF]
    text = prose_tokens(eng.tokenizer)
    half = len(text) // 2
    stride = (half - args.segment_len) // max(args.segments - 1, 1)
    segments = [text[i * stride:i * stride + args.segment_len] for i in range(args.segments)]
    pstride = (half - args.prompt_len) // max(args.prompts, 1)
    prompts = [text[half + i * pstride:half + i * pstride + args.prompt_len]
               for i in range(args.prompts)]
    res: dict = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                             "threads": args.threads, "torch": torch.__version__},
                 "args": vars(args), "model": eng.model_name}
    capacity = {}
    for name, e in engines.items():
        spec = e.kv_spec
        capacity[name] = {"dtype": str(spec.dtype), "bytes_per_token": spec.bytes_per_token,
                          "tokens_in_2GiB": spec.num_blocks_for(BUDGET) * spec.block_size}
    for name in DTYPES:
        capacity[name]["vs_ref"] = (capacity[name]["tokens_in_2GiB"]
                                     / capacity[REF]["tokens_in_2GiB"])
    res["capacity"] = capacity
    spec = eng.kv_spec
    t0 = time.perf_counter()
    res["perplexity"] = perplexity(engines, segments)
    logger.info("perplexity done in %.0f s", time.perf_counter() - t0)
    t0 = time.perf_counter()
    res["greedy"] = greedy_agreement(engines, prompts, args.gen_len)
    logger.info("greedy agreement done in %.0f s", time.perf_counter() - t0)
    kernel = {}
    dtypes = {name: e.kv_spec.dtype for name, e in engines.items()}
    del engines, eng        # free the pools before allocating the kernel's
    for bl in args.kernel_contexts.split(","):
        b, length = map(int, bl.split("x"))
        kernel[bl] = attention_kernel(spec, dtypes, b, length, 20)
    res["attention_kernel_ms"] = kernel
    res["seconds"] = time.perf_counter() - t_start
    print(tables(res))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    logger.info("wrote %s (%.0f s)", args.out, res["seconds"])


def tables(res: dict) -> str:
    ppl, greedy, cap = res["perplexity"], res["greedy"], res["capacity"]
    p0, k = ppl[REF]["ppl"], res["attention_kernel_ms"]
    lines = [
        f"| kv_cache_dtype | perplexity ({ppl[REF]['scored_tokens']} tokens) | vs float32 "
        f"| mean abs logprob diff | greedy agreement ({greedy[REF]['batch']} x "
        f"{res['args']['gen_len']}) | tokens before 1st diff | 1st diffs in float32's top 5 "
        f"(median gap) | bytes/token | tokens in 2 GiB | capacity vs float32 "
        f"| decode tok/s, B={ppl[REF]['batch']} | decode tok/s, B={greedy[REF]['batch']} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in DTYPES:
        p, g, c = ppl[name], greedy[name], cap[name]
        n_diff = g["batch"] - g["identical_sequences"]
        gap = g["median_ref_gap_at_first_difference"]
        lines.append(
            f"| {name} | {p['ppl']:.4f} | {100 * (p['ppl'] / p0 - 1):+.2f}% | "
            f"{p['mean_abs_logprob_diff_vs_ref']:.4f} | {100 * g['agreement']:.1f}% | "
            f"{g['mean_tokens_before_first_difference']:.1f} | "
            f"{g['first_differences_in_ref_top5']}/{n_diff}"
            f"{'' if gap is None else f' ({gap:.3f})'} | {c['bytes_per_token']} | "
            f"{c['tokens_in_2GiB']} | {c['vs_ref']:.2f}x | "
            f"{p['decode_tok_s']:.1f} ({p['decode_tok_s'] / ppl[REF]['decode_tok_s']:.2f}x) "
            f"| {g['decode_tok_s']:.1f} ({g['decode_tok_s'] / greedy[REF]['decode_tok_s']:.2f}x) |")
    lines += ["", "| decode attention, one layer (C++ kernel), ms: median (best), speed-up "
              "vs float32 | " + " | ".join(DTYPES) + " |", "|---|" + "---:|" * len(DTYPES)]
    for bl, row in k.items():
        if row is None:
            continue
        b, length = bl.split("x")
        base = row[REF]["median_ms"]
        lines.append(f"| B={b}, context {length} | " + " | ".join(
            f"{row[n]['median_ms']:.2f} ({row[n]['best_ms']:.2f}), "
            f"{base / row[n]['median_ms']:.2f}x" for n in DTYPES) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
