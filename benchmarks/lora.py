"""Multi-LoRA throughput: 64 requests (128 in / 128 out) spread over 0, 1, 4 and 8 distinct
rank-16 adapters on every linear, vs the base model without LoRA, same run.

    python benchmarks/lora.py                 # SmolLM2-135M-Instruct (the default model)
    python benchmarks/lora.py --quick         # tiny sizes, smoke test

Request i runs adapter i mod k (k = number of adapters), so with k > 1 every step mixes k
adapters. "0 adapters" is the LoRA-enabled engine serving only base requests (the cost of
having LoRA on). The base engine (LoRA off) runs before and after every LoRA run; each ratio
is against the mean of those two. Reach (issue 14): 4 adapters >= 0.75x base, 8 >= 0.65x. Prints a table and
writes JSON to benchmarks/results/lora.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from pagedllm import LLM, LoRARequest, SamplingParams
from pagedllm.lora.targets import LINEAR

logger = logging.getLogger("benchmarks.lora")
ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    from pydoc_data.topics import topics

    ids = tokenizer.encode(" ".join(topics.values()))
    stride = max(length, (len(ids) - length) // max(n, 1))
    return [ids[i * stride:i * stride + length] for i in range(n)]


def write_random_adapter(path: Path, specs, rank: int, seed: int) -> Path:
    """A PEFT-format adapter with random A and B on every linear of the model."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for s in specs.values():
        if s.kind == LINEAR:
            tensors[f"base_model.model.{s.name}.lora_A.weight"] = (
                torch.randn(rank, s.in_features, generator=gen) * 0.02)
            tensors[f"base_model.model.{s.name}.lora_B.weight"] = (
                torch.randn(s.out_features, rank, generator=gen) * 0.02)
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
        "target_modules": ALL_LINEARS}))
    save_file(tensors, str(path / "adapter_model.safetensors"))
    return path


def run(llm: LLM, prompts, output_len: int, loras) -> dict:
    sp = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    # Warm-up at the full batch (first-touch of the KV pool and activation buffers, adapters
    # loaded into their slots), two tokens each.
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                 use_tqdm=False, lora_request=loras)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False, lora_request=loras)
    dt = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    logger.info("%d adapters: %.1f output tok/s", len({lr for lr in loras or []}), n_out / dt)
    return {"seconds": dt, "output_tokens": n_out, "output_tok_s": n_out / dt}


def interleaved_steps(engines: dict, prompts, rounds: int, steps: int) -> dict:
    """Decode-step time of each engine, measured in alternation: every engine holds the same
    64 requests (prompts prefilled first), then each round times `steps` decode steps of each
    engine in turn. Drift of a shared machine's load hits all engines alike; the ratio per
    round is the engine's step time over the base's, and the median over rounds is reported."""
    sp = SamplingParams(temperature=0, max_tokens=3 * rounds + 8, ignore_eos=True)
    for name, (llm, loras) in engines.items():
        eng = llm.llm_engine
        for i, p in enumerate(prompts):
            eng.add_request(p, sp, lora_request=loras[i] if loras else None)
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.requests):
            eng.step()
        logger.info("%s: prompts prefilled", name)
    times: dict[str, list[float]] = {n: [] for n in engines}
    for _ in range(rounds):
        for name, (llm, _) in engines.items():
            t0 = time.perf_counter()
            for _ in range(steps):
                llm.llm_engine.step()
            times[name].append((time.perf_counter() - t0) / steps)
    for llm, _ in engines.values():
        eng = llm.llm_engine
        eng.abort_request([s.group_id for s in eng.output_processor.sequences()])
        eng.step()
    out = {}
    for name, ts in times.items():
        ratios = sorted(b / t for b, t in zip(times["base"], ts, strict=True))
        out[name] = {"step_s": ts, "decode_tok_s": len(prompts) / (sum(ts) / len(ts)),
                     "vs_base": ratios[len(ratios) // 2]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--adapters", default="0,1,4,8")
    ap.add_argument("--kv-cache-memory", type=int, default=None,
                    help="bytes per engine (default: room for every request, SmolLM2 fp32)")
    ap.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--steps", action="store_true",
                    help="decode steps of every configuration in alternation (robust on a "
                    "machine whose load drifts) instead of end-to-end runs")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    ap.add_argument("--out", default="benchmarks/results/lora.json")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.quick:
        args.num_requests, args.input_len, args.output_len = 8, 16, 8
    counts = [int(x) for x in args.adapters.split(",")]
    # KV for every request at once (two engines in one process: keep it small).
    max_len = args.input_len + max(args.output_len, 3 * args.rounds) + 16
    kv = args.num_requests * max_len * 46080 + 2**26
    # Prefix caching off: every run repeats the same prompts, and the base engine would find
    # the previous run's prefixes cached while a run under other adapters (other block
    # hashes) would not, which measures the cache instead of LoRA.
    common = {"max_num_seqs": args.num_requests, "kv_cache_memory": args.kv_cache_memory or kv,
              "max_model_len": max_len, "num_threads": args.num_threads,
              "enable_prefix_caching": False}
    base = LLM(args.model, **common)
    lora = LLM(args.model, enable_lora=True, max_loras=max(max(counts), 1),
               max_lora_rank=args.rank, **common)
    prompts = make_prompts(base.get_tokenizer(), args.num_requests, args.input_len)
    tmp = Path(tempfile.mkdtemp(prefix="pagedllm-lora-bench-"))
    specs = lora.llm_engine.lora.specs
    adapters = [LoRARequest(f"bench{i}", i + 1,
                            str(write_random_adapter(tmp / f"a{i}", specs, args.rank, i)))
                for i in range(max(counts))]
    res: dict = {"machine": {"platform": platform.platform(), "cpu": platform.processor(),
                             "threads": torch.get_num_threads(), "torch": torch.__version__},
                 "args": vars(args), "runs": {}}
    if args.steps:
        engines = {"base": (base, None)}
        for k in counts:
            llm = lora if k == 0 else LLM(args.model, enable_lora=True, max_loras=max(k, 1),
                                          max_lora_rank=args.rank, **common)
            engines[f"{k}_adapters"] = (
                llm, [adapters[i % k] for i in range(len(prompts))] if k else None)
        res["steps"] = interleaved_steps(engines, prompts, args.rounds, 3)
        print(f"{'workload (decode steps of ' + str(len(prompts)) + ')':32s} "
              f"{'decode tok/s':>12s} {'vs base (median)':>17s}")
        for name, r in res["steps"].items():
            print(f"{name:32s} {r['decode_tok_s']:12.1f} {r['vs_base']:16.2f}x")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(res, indent=2))
        logger.info("wrote %s", args.out)
        return
    # base, k0, base, k1, base, ...: each LoRA run is compared with the mean of the base runs
    # right before and after it, so a machine whose load drifts during the run (shared CI
    # hosts) does not tilt the ratios.
    bases = [run(base, prompts, args.output_len, None)]
    for k in counts:
        loras = [adapters[i % k] for i in range(len(prompts))] if k else None
        r = run(lora, prompts, args.output_len, loras)
        bases.append(run(base, prompts, args.output_len, None))
        r["base_output_tok_s"] = (bases[-2]["output_tok_s"] + bases[-1]["output_tok_s"]) / 2
        r["vs_base"] = r["output_tok_s"] / r["base_output_tok_s"]
        res["runs"][f"{k}_adapters"] = r
    res["base_runs"] = bases
    print(f"{'workload':16s} {'out tok/s':>10s} {'base tok/s (around)':>20s} {'vs base':>8s}")
    for name, r in res["runs"].items():
        print(f"{name:16s} {r['output_tok_s']:10.1f} {r['base_output_tok_s']:20.1f} "
              f"{r['vs_base']:7.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
