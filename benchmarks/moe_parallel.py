"""Mixture of experts under tensor parallelism: experts split by width (TP-experts, the
default) vs whole experts per rank (`--enable-expert-parallel`, EP), against TP=1, on a random
Qwen3-MoE checkpoint written here (no download; fp32).

    python benchmarks/moe_parallel.py                  # writes results/moe_parallel.json
    python benchmarks/moe_parallel.py --decode-steps 8 --prompt-len 128      # short run

Per configuration: the ms of one decode step of --num-seqs sequences, of one prefill of
--prompt-len tokens (the fastest of --repeats interleaved runs), and whether the greedy
tokens equal TP=1's. TP=2 runs one torch thread per rank; TP=1 runs with one thread and with
two (the same cores as TP=2). Only same-run ratios count; the machine's load average is
recorded with the numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
VOCAB = 512


def write_checkpoint(path: Path, args) -> Path:
    """A random Qwen3-MoE of the given shape with a byte-level BPE tokenizer trained here."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([__doc__ * 4], trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>",
                                                eos_token="</s>")
    cfg = transformers.Qwen3MoeConfig(
        hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=8,
        num_key_value_heads=4, head_dim=args.hidden // 8, intermediate_size=4 * args.hidden,
        moe_intermediate_size=args.expert_width, num_experts=args.experts,
        num_experts_per_tok=args.top_k, norm_topk_prob=True, vocab_size=VOCAB,
        max_position_embeddings=4096, bos_token_id=0, eos_token_id=1,
        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    with torch.no_grad():  # decisive greedy tokens, as the tests' tiny models
        for name, p in model.named_parameters():
            if "norm" not in name and p.dim() > 1:
                p.mul_(8.0)
    model.save_pretrained(path, safe_serialization=True)
    fast.save_pretrained(path)
    return path


def bench(model: Path, tp: int, threads: int, expert_parallel: bool, args) -> dict:
    from pagedllm import SamplingParams
    from pagedllm.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(
        model=str(model), tensor_parallel_size=tp, num_threads=threads,
        enable_expert_parallel=expert_parallel, kv_cache_memory="256MiB", max_model_len=2048,
        generation_config="vllm", max_num_batched_tokens=max(2048, args.prompt_len))
    try:
        greedy = SamplingParams(max_tokens=args.decode_steps + 1, temperature=0,
                                ignore_eos=True)
        for i in range(args.num_seqs):
            prompt = [(17 * i + 31 * j) % (VOCAB - 2) + 2 for j in range(32)]
            engine.add_request(prompt, greedy, request_id=f"d{i}")
        engine.step()  # the prefills
        t0 = time.perf_counter()
        steps = 0
        tokens: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    tokens[out.request_id] = list(out.outputs[0].token_ids)
            steps += 1
        decode_ms = (time.perf_counter() - t0) * 1e3 / max(1, steps)
        one = SamplingParams(max_tokens=1, temperature=0)
        engine.add_request([(7 * j) % (VOCAB - 2) + 2 for j in range(args.prompt_len)], one,
                           request_id="prefill")
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        prefill_ms = (time.perf_counter() - t0) * 1e3
    finally:
        engine.shutdown()
    name = "TP=1" if tp == 1 else ("TP=2 EP" if expert_parallel else "TP=2 TP-experts")
    return {"config": name, "tp": tp, "threads_per_rank": threads,
            "expert_parallel": expert_parallel, "decode_step_ms": decode_ms,
            "prefill_ms": prefill_ms, "tokens": [tokens[k] for k in sorted(tokens)]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--expert-width", type=int, default=256)
    p.add_argument("--num-seqs", type=int, default=16, help="sequences decoding together")
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=512, help="prefill length")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each configuration, interleaved; the fastest one is kept")
    p.add_argument("--skip-oversubscribed", action="store_true",
                   help="leave out TP=1 with 2 threads")
    p.add_argument("--result-file", default=str(HERE / "results" / "moe_parallel.json"))
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "load_avg_before": os.getloadavg(),
            "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        model = write_checkpoint(Path(tmp) / "qwen3_moe", args)
        configs = [(1, 1, False), (1, 2, False), (2, 1, False), (2, 1, True)]
        if args.skip_oversubscribed:
            configs.pop(1)
        tries = [[bench(model, *c, args) for c in configs] for _ in range(args.repeats)]
        runs = [min((t[i] for t in tries), key=lambda r: r["decode_step_ms"] + r["prefill_ms"])
                for i in range(len(configs))]
        for i, run in enumerate(runs):  # the fastest decode and prefill of the repeats
            run["decode_step_ms"] = min(t[i]["decode_step_ms"] for t in tries)
            run["prefill_ms"] = min(t[i]["prefill_ms"] for t in tries)
    meta["load_avg_after"] = os.getloadavg()
    for r in runs:
        r["greedy_identical_to_tp1"] = r["tokens"] == runs[0]["tokens"]
    for r in runs:
        r.pop("tokens")
    print(f"\nQwen3-MoE random: hidden {args.hidden}, {args.layers} layers, {args.experts} "
          f"experts of width {args.expert_width}, top-{args.top_k}; {args.num_seqs} seqs "
          f"decoding, prefill {args.prompt_len} tokens; load avg {meta['load_avg_before']}")
    print("| config | threads/rank | decode step ms | prefill ms | greedy = TP=1 |")
    print("|---|---:|---:|---:|---|")
    for r in runs:
        print(f"| {r['config']} | {r['threads_per_rank']} | {r['decode_step_ms']:.1f} | "
              f"{r['prefill_ms']:.0f} | {r['greedy_identical_to_tp1']} |")
    tp_e, ep = runs[-2], runs[-1]
    print(f"EP / TP-experts: decode step {ep['decode_step_ms'] / tp_e['decode_step_ms']:.2f}x, "
          f"prefill {ep['prefill_ms'] / tp_e['prefill_ms']:.2f}x")
    Path(args.result_file).parent.mkdir(parents=True, exist_ok=True)
    Path(args.result_file).write_text(json.dumps({"meta": meta, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
