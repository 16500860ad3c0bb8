"""Offline throughput: pagedllm vs HF transformers `generate`, same weights, same prompts, one run.

    python benchmarks/throughput.py                      # 64 requests, 128 in / 128 out
    python benchmarks/throughput.py --quick              # tiny sizes, smoke test

Workloads (greedy, ignore_eos):
  * batch:   N requests of `--input-len` tokens, `--output-len` new tokens each, all queued at
             once (pagedllm) vs HF generate in fixed batches of 8 and 32;
  * single:  one request's decode speed (tokens/s after the first token);
  * prefill: time to first token of one `--prefill-len`-token prompt.
Prints a table with pagedllm / HF ratios and writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from pathlib import Path

import torch

from pagedllm import LLM, SamplingParams
from pagedllm.loader import hf_reference_dir

logger = logging.getLogger("benchmarks.throughput")


def make_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """Distinct `length`-token prompts cut from the stdlib's pydoc prose."""
    from pydoc_data.topics import topics

    ids = tokenizer.encode(" ".join(topics.values()))
    stride = max(length, (len(ids) - length) // max(n, 1))
    return [ids[i * stride:i * stride + length] for i in range(n)]


def bench_pagedllm(llm: LLM, prompts, output_len: int) -> dict:
    sp = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    dt = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"requests": len(prompts), "seconds": dt, "output_tokens": n_out,
            "output_tok_s": n_out / dt,
            "total_tok_s": (n_out + sum(map(len, prompts))) / dt}


def bench_single(llm: LLM, prompt, output_len: int) -> dict:
    eng = llm.llm_engine
    eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=output_len,
                                           ignore_eos=True))
    t_first = None
    t0 = time.perf_counter()
    n = 0
    while eng.has_unfinished_requests():
        for _ in eng.step():
            n += 1
            if t_first is None:
                t_first = time.perf_counter()
    dt = time.perf_counter() - t_first
    return {"decode_tok_s": (output_len - 1) / dt, "ttft_s": t_first - t0}


def bench_prefill(llm: LLM, prompt) -> dict:
    sp = SamplingParams(temperature=0, max_tokens=1)
    t0 = time.perf_counter()
    llm.generate([prompt], sp, use_tqdm=False)
    dt = time.perf_counter() - t0
    return {"prompt_tokens": len(prompt), "seconds": dt, "prefill_tok_s": len(prompt) / dt}


def bench_hf(model, prompts, output_len: int, batch: int) -> dict:
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    t0 = time.perf_counter()
    n_out = 0
    with torch.inference_mode():
        for i in range(0, len(prompts), batch):
            ids = torch.tensor(prompts[i:i + batch])
            out = model.generate(ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=output_len, min_new_tokens=output_len,
                                 do_sample=False)
            n_out += (out.shape[1] - ids.shape[1]) * ids.shape[0]
    dt = time.perf_counter() - t0
    return {"requests": len(prompts), "batch": batch, "seconds": dt, "output_tok_s": n_out / dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--hf-batches", default="8,32")
    ap.add_argument("--hf-requests", type=int, default=None,
                    help="requests per HF batch size (default: 2 batches' worth)")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke)")
    ap.add_argument("--out", default="benchmarks/results/throughput.json")
    ap.add_argument("--engine-arg", action="append", default=[],
                    help="extra engine arg key=value (e.g. max_num_seqs=64)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.quick:
        args.num_requests, args.input_len, args.output_len, args.prefill_len = 4, 16, 8, 32
        args.hf_batches = "2"
    engine_args = {}
    for kv in args.engine_arg:
        k, v = kv.split("=", 1)
        engine_args[k] = int(v) if v.isdigit() else v
    engine_args.setdefault("max_num_seqs", max(args.num_requests, 1))
    llm = LLM(args.model, **engine_args)
    tok = llm.get_tokenizer()
    prompts = make_prompts(tok, args.num_requests, args.input_len)
    res: dict = {"machine": {"platform": platform.platform(), "cpu": platform.processor(),
                             "threads": torch.get_num_threads(), "torch": torch.__version__},
                 "args": vars(args), "pagedllm": {}, "hf": {}}
    res["pagedllm"]["batch"] = bench_pagedllm(llm, prompts, args.output_len)
    res["pagedllm"]["single"] = bench_single(llm, prompts[0], args.output_len)
    long_prompt = make_prompts(tok, 1, args.prefill_len)[0]
    res["pagedllm"]["prefill"] = bench_prefill(llm, long_prompt)
    if not args.no_hf:
        from transformers import AutoModelForCausalLM

        src = hf_reference_dir(args.model)
        hf = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
        for b in (int(x) for x in args.hf_batches.split(",")):
            n = args.hf_requests or min(len(prompts), 2 * b)
            res["hf"][f"batch{b}"] = bench_hf(hf, prompts[:n], args.output_len, b)
    print_table(res)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    logger.info("wrote %s", args.out)


def print_table(res: dict) -> None:
    p = res["pagedllm"]
    rows = [("pagedllm batch (all queued)", p["batch"]["output_tok_s"]),
            ("pagedllm single-request decode", p["single"]["decode_tok_s"]),
            ("pagedllm prefill tok/s", p["prefill"]["prefill_tok_s"])]
    for name, r in res["hf"].items():
        rows.append((f"HF generate {name}", r["output_tok_s"]))
    print(f"{'workload':40s} {'tok/s':>10s}")
    for name, v in rows:
        print(f"{name:40s} {v:10.1f}")
    for name, r in res["hf"].items():
        print(f"ratio pagedllm batch / HF {name}: {p['batch']['output_tok_s'] / r['output_tok_s']:.2f}x")


if __name__ == "__main__":
    main()
