"""In-process workloads: pagedllm (`LLM`, `LLMEngine.step`) and HF transformers.

Offline throughput at concurrency c: pagedllm runs `LLM.generate` over all requests with
`max_num_seqs=c`; HF runs `generate` in batches of c over the same prompts (both greedy,
ignore_eos). Output tok/s = generated tokens / wall time, prefill included.

KV memory efficiency: after every `engine.step()` the running requests' block tables are
sampled. A slot is *used* once its token's K/V is written (`num_computed_tokens`); the rest of
an allocated block is allocated-but-unused:

    block_size 4, num_computed_tokens 10, block_ids [7, 2, 9]:
      block 7: t0 t1 t2 t3 | block 2: t4 t5 t6 t7 | block 9: t8 t9 -- --
      allocated 12 slots, used 10, waste 2 (16.7%)

The contiguous baselines are computed at the same samples, for the same running requests:
reserving max_model_len slots per sequence (static KV caches) or prompt + max_tokens (the
request's own maximum, as Orca-style reservation does).
"""

from __future__ import annotations

import gc
import random
import statistics
import time

import torch

from benchmarks.throughput import bench_hf, bench_pagedllm, make_prompts
from pagedllm import LLM, SamplingParams


def new_llm(model: str | None, threads: int, **engine_args) -> LLM:
    gc.collect()  # drop the previous engine's KV pool before allocating the next one
    return LLM(model, num_threads=threads, **engine_args)


# ------------------------------------------------------------------ offline + prefill
def pagedllm_offline(model: str | None, threads: int, prompts: list[list[int]], output_len: int,
                     concurrency: int, engine_args: dict) -> dict:
    llm = new_llm(model, threads, max_num_seqs=concurrency, **engine_args)
    res = bench_pagedllm(llm, prompts, output_len)
    res["concurrency"] = concurrency
    return res


def hf_offline(hf_model, prompts: list[list[int]], output_len: int, concurrency: int) -> dict:
    with torch.inference_mode():
        warm = torch.tensor(prompts[:1])
        hf_model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=2,
                          do_sample=False, pad_token_id=0)
    res = bench_hf(hf_model, prompts, output_len, concurrency)
    res["output_tokens"] = round(res["output_tok_s"] * res["seconds"])
    res["concurrency"] = concurrency
    return res


def pagedllm_prefill(llm: LLM, prompts: list[list[int]]) -> dict:
    """Median time of `max_tokens=1` requests, one per distinct prompt (no prefix-cache hits)."""
    sp = SamplingParams(temperature=0, max_tokens=1)
    llm.generate([prompts[0][:16]], sp, use_tqdm=False)
    times = []
    for p in prompts:
        t0 = time.perf_counter()
        llm.generate([p], sp, use_tqdm=False)
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    return {"prompt_tokens": len(prompts[0]), "reps": len(prompts), "seconds": dt,
            "prefill_tok_s": len(prompts[0]) / dt}


@torch.inference_mode()
def hf_prefill(hf_model, prompts: list[list[int]]) -> dict:
    """Median time of one forward pass over the prompt, last position's logits only."""
    hf_model(torch.tensor([prompts[0][:16]]), logits_to_keep=1)
    times = []
    for p in prompts:
        t0 = time.perf_counter()
        hf_model(torch.tensor([p]), logits_to_keep=1, use_cache=True)
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    return {"prompt_tokens": len(prompts[0]), "reps": len(prompts), "seconds": dt,
            "prefill_tok_s": len(prompts[0]) / dt}


def load_hf(model: str | None):
    from transformers import AutoModelForCausalLM

    from pagedllm.loader import hf_reference_dir

    src = hf_reference_dir(model)
    return AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval(), str(src)


# ------------------------------------------------------------------ KV memory
def mixed_requests(tokenizer, n: int, prompt_range: tuple[int, int],
                   output_range: tuple[int, int], seed: int = 0) -> list[tuple[list[int], int]]:
    """`n` (prompt token ids, max_tokens) pairs with lengths uniform in the given ranges."""
    rng = random.Random(seed)
    base = make_prompts(tokenizer, n, prompt_range[1])
    return [(p[:rng.randint(*prompt_range)], rng.randint(*output_range)) for p in base]


def kv_sample(engine) -> dict[str, int]:
    """Allocated and used KV slots of the running requests (a block shared by several
    requests counts once, as full as its fullest holder)."""
    bs = engine.block_manager.block_size
    filled: dict[int, int] = {}
    running = list(engine.scheduler.running)
    for req in running:
        n = req.num_computed_tokens
        for i, b in enumerate(req.block_ids):
            filled[b] = max(filled.get(b, 0), min(bs, max(0, n - i * bs)))
    used = sum(filled.values())
    return {"running": len(running), "waiting": len(engine.scheduler.waiting),
            "allocated": len(filled) * bs, "used": used,
            "reserved_max_len": len(running) * engine.config.max_model_len,
            "reserved_request_max": sum(r.num_prompt_tokens + r.max_tokens for r in running)}


def run_mixed(llm: LLM, requests: list[tuple[list[int], int]]) -> dict:
    """All requests queued at once; one KV sample after each step."""
    engine = llm.llm_engine
    llm.generate([requests[0][0][:8]], SamplingParams(temperature=0, max_tokens=2),
                 use_tqdm=False)
    preempt0 = getattr(engine.scheduler, "num_preemptions", 0)
    for prompt, max_tokens in requests:
        engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                  ignore_eos=True))
    samples = []
    n_out = 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                n_out += sum(len(c.token_ids) for c in out.outputs)
        samples.append(kv_sample(engine))
    dt = time.perf_counter() - t0
    samples = [s for s in samples if s["allocated"]]

    def pct_unused(key: str) -> float:
        total = sum(s[key] for s in samples)
        return 100.0 * (1 - sum(s["used"] for s in samples) / total) if total else 0.0

    per_step = [100.0 * (1 - s["used"] / s["allocated"]) for s in samples]
    running = [s["running"] for s in samples]
    # steps with requests still queued: the pool (not the workload) limited concurrency
    saturated = [s["running"] for s in samples if s["waiting"]] or running
    return {
        "requests": len(requests), "block_size": engine.block_manager.block_size,
        "num_blocks": engine.num_blocks, "max_model_len": engine.config.max_model_len,
        "seconds": dt, "output_tokens": n_out, "output_tok_s": n_out / dt,
        "steps_sampled": len(samples),
        # pooled over all samples (slot-steps), and the distribution of the per-step values
        "kv_waste_pct": pct_unused("allocated"),
        "kv_waste_pct_median_step": statistics.median(per_step) if per_step else 0.0,
        "kv_waste_pct_max_step": max(per_step, default=0.0),
        "contiguous_max_len_waste_pct": pct_unused("reserved_max_len"),
        "contiguous_request_max_waste_pct": pct_unused("reserved_request_max"),
        "running_max": max(running, default=0),
        "running_mean": statistics.fmean(running) if running else 0.0,
        "running_mean_saturated": statistics.fmean(saturated) if saturated else 0.0,
        "preemptions": getattr(engine.scheduler, "num_preemptions", 0) - preempt0,
    }


def block_size_sweep(model: str | None, threads: int, requests, block_sizes: list[int],
                     max_num_seqs: int, engine_args: dict) -> list[dict]:
    rows = []
    for bs in block_sizes:
        llm = new_llm(model, threads, block_size=bs, max_num_seqs=max_num_seqs, **engine_args)
        rows.append(run_mixed(llm, requests))
        del llm
    return rows


def fixed_budget(model: str | None, threads: int, requests, *, budget_tokens: int,
                 max_model_len: int, block_size: int, kv_bytes_per_token: int,
                 engine_args: dict) -> dict:
    """Concurrent sequences that a KV pool of `budget_tokens` slots sustains, paged vs a
    contiguous reservation of max_model_len (or prompt + max_tokens) slots per sequence."""
    args = {k: v for k, v in engine_args.items() if k not in ("kv_cache_memory", "max_model_len")}
    llm = new_llm(model, threads, block_size=block_size, max_model_len=max_model_len,
                  max_num_seqs=len(requests), kv_cache_memory=budget_tokens * kv_bytes_per_token,
                  **args)
    res = run_mixed(llm, requests)
    mean_reservation = statistics.fmean(len(p) + m for p, m in requests)
    res.update(budget_tokens=budget_tokens, kv_bytes_per_token=kv_bytes_per_token,
               contiguous_max_len_seqs=budget_tokens // max_model_len,
               contiguous_request_max_seqs=budget_tokens / mean_reservation)
    res["paged_vs_contiguous"] = (res["running_mean_saturated"]
                                  / max(res["contiguous_max_len_seqs"], 1))
    return res
