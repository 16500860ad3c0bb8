"""Mixture of experts: a random MoE against a dense model with equal active parameters, and the
same MoE as a GGUF file against llama.cpp, one run.

    python benchmarks/moe.py                        # hidden 1024, 8 layers (~15 min, 2 cores)
    python benchmarks/moe.py --quick                # tiny sizes, smoke test (~2 min)
    nice -n 19 python benchmarks/peers.py --prepare --peers llama.cpp --no-bindings   # once

Models (random weights, written once under --work-dir; greedy, ignore_eos throughout):
  moe     Mixtral layout: E experts of width I, top-k routing (default 8 experts, top-2)
  dense   Llama, the same but an MLP of width k * I: its MLP parameters equal the MoE's active
          ones (the router's H x E per layer aside); both decode in the C++ layer loop
          (model/fused_decode.py; MoE layers through kernels/moe_decode_cpu.h)
  dense-py  the dense model with PAGEDLLM_FUSED_DECODE=0: Python layers
  gguf    the MoE written as a GGUF file (--gguf-type, default Q8_0), run by pagedllm (its
          default: blocks kept quantized, int8 activations where the CPU has VNNI) and by
          llama.cpp (`llama-batched-bench`, `llama-bench`)
Workloads:
  decode  output tok/s at 1 and 32 sequences (--prompt-len-token prompts, --output-len new
          tokens; prefill included, as benchmarks/peers.py counts llama-batched-bench's B x TG / T)
  prefill one --prefill-len prompt, tok/s (median of --prefill-reps)
  layer   one MoE layer's experts (fp32) at 1, 32 and 512 tokens: the grouped C++ kernel
          calls against the per-expert torch.mm loop they replaced, and the time of the steps
          between and after them (SiLU * up, the weighted combine): what fusing them into the
          GEMMs could save at most; the same experts in bf16: the grouped bf16 kernel against
          the per-expert torch bf16 loop and against the fp32 grouped kernel, and the bf16
          kernel's two paths (exact widened fp32 vs avx512_bf16 dot product) at 1 ... 128 rows
          per expert, where grouped_bf16.MIN_BF16_ROWS comes from
          (`--only layer` runs this workload alone, in a minute)
Reach (issue #31): MoE decode at 1 sequence within 1.3x of the dense model; pagedllm's GGUF
decode at 32 sequences >= llama.cpp's. Prints a table, writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch

logger = logging.getLogger("benchmarks.moe")
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python benchmarks/moe.py` puts benchmarks/, not the root
    sys.path.insert(0, str(ROOT))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--expert-width", type=int, default=1024, help="I, each expert's width")
    ap.add_argument("--gguf-type", default="Q8_0", choices=["Q8_0", "Q4_0", "Q4_1", "F32"])
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--prefill-reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--peer-dir", default=None, help="where peers.py --prepare built llama.cpp")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--work-dir", default=None,
                    help="where the random models are written (default: a cache dir per size)")
    ap.add_argument("--quick", action="store_true",
                    help="hidden 256, 2 layers, width 256, 8 new tokens, concurrency 1 and 4")
    ap.add_argument("--only", choices=["layer"], default=None,
                    help="run one workload (no models written, no engines)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="layer workload: the calling thread's CPU time instead of wall time "
                         "(with --threads 1 the kernels run in that thread; steadier on a "
                         "shared machine, blind to waiting for memory no more than wall time)")
    ap.add_argument("--dtype", default="auto",
                    help="pagedllm's --dtype for both models (auto: bf16 weights on CPUs with "
                         "bf16 matrix instructions, config/dtype.py; float32 pins fp32)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="one-sequence decode of the MoE and the dense model alternated this "
                         "many times in one process (the reach ratio, steadier than one run "
                         "each on a shared machine); 0 skips it")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.expert_width = 256, 2, 256
        args.output_len, args.prefill_len, args.prefill_reps = 8, 64, 1
        args.concurrency = "1,4"
    args.levels = [int(c) for c in args.concurrency.split(",")]
    if args.cpu_time and args.threads != 1:
        ap.error("--cpu-time measures one thread: pass --threads 1")
    name = "moe_quick" if args.quick else "moe"
    args.out = args.out or str(ROOT / "benchmarks/results" /
                               (f"{name}_{args.only}.json" if args.only else f"{name}.json"))
    return args


# ------------------------------------------------------------------ models
def build_models(args) -> dict[str, Path]:
    """The MoE and dense HF directories and the MoE's GGUF file (written once per size)."""
    import transformers

    key = (f"h{args.hidden}_l{args.layers}_e{args.experts}k{args.top_k}_i{args.expert_width}")
    work = Path(args.work_dir or Path.home() / ".cache/pagedllm/bench_moe") / key
    paths = {"moe": work / "moe", "dense": work / "dense",
             "gguf": work / f"moe-{args.gguf_type}.gguf"}
    common = dict(hidden_size=args.hidden, num_hidden_layers=args.layers,
                  num_attention_heads=args.hidden // 64, num_key_value_heads=max(1, args.hidden // 256),
                  vocab_size=512, max_position_embeddings=4096, bos_token_id=0, eos_token_id=1,
                  tie_word_embeddings=False, rms_norm_eps=1e-5)
    configs = {
        "moe": (transformers.MixtralConfig(**common, intermediate_size=args.expert_width,
                                           num_local_experts=args.experts,
                                           num_experts_per_tok=args.top_k),
                transformers.MixtralForCausalLM),
        "dense": (transformers.LlamaConfig(**common,
                                           intermediate_size=args.top_k * args.expert_width),
                  transformers.LlamaForCausalLM),
    }
    from benchmarks.step_cost import pydoc_tokenizer

    tokenizer = None
    for name, (cfg, cls) in configs.items():
        if (paths[name] / "config.json").is_file():
            continue
        tokenizer = tokenizer or pydoc_tokenizer()
        logger.info("writing the random %s model to %s", name, paths[name])
        torch.manual_seed(0)
        cls(cfg).save_pretrained(paths[name])
        tokenizer.save_pretrained(paths[name])
    if not paths["gguf"].is_file():
        import gguf

        from tests.loader.gguf_writer import write_gguf  # Mixtral as llama.cpp lays it out

        logger.info("writing %s", paths["gguf"])
        write_gguf(paths["moe"], paths["gguf"], "llama", gguf.GGMLQuantizationType[args.gguf_type])
    return paths


# ------------------------------------------------------------------ workloads
def prompts_of(model_dir: Path, n: int, length: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    from benchmarks.throughput import make_prompts

    return make_prompts(AutoTokenizer.from_pretrained(model_dir), n, length)


def pagedllm_runs(model: Path, args, prompts, long_prompts, env: dict[str, str]) -> dict:
    """Decode at each level and prefill, with `env` set while the engines are built."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return _pagedllm_runs(model, args, prompts, long_prompts)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _pagedllm_runs(model: Path, args, prompts, long_prompts) -> dict:
    from benchmarks.peers_lib.workloads import new_llm, pagedllm_offline, pagedllm_prefill

    res: dict = {"decode": {}}
    for c in args.levels:
        res["decode"][c] = pagedllm_offline(str(model), args.threads, prompts[:c],
                                            args.output_len, c, {"dtype": args.dtype})
        logger.info("%s c=%d: %.1f tok/s", model.name, c, res["decode"][c]["output_tok_s"])
    llm = new_llm(str(model), args.threads, max_num_seqs=1, dtype=args.dtype)
    res["linear_dtype"] = str(llm.llm_engine.config.linear_dtype).removeprefix("torch.")
    res["prefill"] = pagedllm_prefill(llm, long_prompts)
    del llm
    return res


def llama_cpp_runs(gguf_path: Path, args) -> dict | None:
    from benchmarks.peers_lib import llamacpp
    from benchmarks.peers_lib import prepare as prep

    bins = prep.llama_binaries(prep.peer_dir(args.peer_dir))
    if bins is None:
        logger.warning("llama.cpp is not prepared: run `python benchmarks/peers.py --prepare "
                       "--peers llama.cpp --no-bindings` (skipped)")
        return None
    bench = llamacpp.batched_bench(bins["llama-batched-bench"], gguf_path, threads=args.threads,
                                   npp=args.prompt_len, ntg=args.output_len, npl=args.levels)
    decode = {r["batch"]: r for r in bench["rows"]}  # output_tok_s: B x TG / T
    prefill = llamacpp.llama_bench_prefill(bins["llama-bench"], gguf_path, threads=args.threads,
                                           n_prompt=args.prefill_len, reps=args.prefill_reps)
    return {"decode": decode, "prefill": prefill, "commands": [bench["command"],
                                                               prefill["command"]]}


def timed(fn, reps: int, clock=time.perf_counter) -> float:
    """Median ms of `reps` calls of fn (after one warm-up call), by `clock`."""
    fn()
    times = []
    for _ in range(reps):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return 1e3 * statistics.median(times)


def clock(args):
    """What the layer workload times by: wall time, or with --cpu-time the thread's CPU time."""
    return time.thread_time if args.cpu_time else time.perf_counter


def per_expert_loop(w_gate_up: torch.Tensor, w_down: torch.Tensor):
    """The per-expert torch loop over rows sorted by expert (`counts` rows each): one GEMM
    pair per expert with tokens, in the weights' dtype."""
    from pagedllm.model.layers.activation import silu_and_mul

    def loop(xs: torch.Tensor, counts: list[int]) -> torch.Tensor:
        out, start = torch.empty_like(xs), 0
        for e, n in enumerate(counts):
            if n:
                h = silu_and_mul(torch.mm(xs[start:start + n], w_gate_up[e].t()))
                torch.mm(h, w_down[e].t(), out=out[start:start + n])
                start += n
        return out

    return loop


@torch.inference_mode()
def layer_runs(args) -> dict:
    """One MoE layer's experts over rows already sorted by expert: the two grouped kernel
    calls (gate|up, SiLU * up, down) against the per-expert loop, ms per call."""
    from pagedllm.model.layers.activation import silu_and_mul
    from pagedllm.model.layers.moe import RouterSpec, StackedExperts, select_experts
    from pagedllm.model.layers.moe.grouped import offsets_of

    experts = StackedExperts(args.experts, args.hidden, args.expert_width)
    experts.gate_up_proj.normal_(0, args.hidden ** -0.5)
    experts.down_proj.normal_(0, args.expert_width ** -0.5)
    w_gate_up, w_down = experts.gate_up_proj.clone(), experts.down_proj.clone()
    experts.finalize()

    loop = per_expert_loop(w_gate_up, w_down)  # what StackedExperts.forward ran before

    if experts.packed is None:
        raise RuntimeError("the grouped CPU kernels are not built here")
    gate_up, down = experts.packed
    out = {}
    for tokens in (1, 32, 512):
        weights, ids = select_experts(torch.randn(tokens, args.experts),
                                      RouterSpec(args.experts, args.top_k, renormalize=True))
        order = torch.argsort(ids.reshape(-1), stable=True)
        counts = torch.bincount(ids.reshape(-1), minlength=args.experts).tolist()
        xs = torch.randn(tokens, args.hidden)[order // args.top_k].contiguous()
        offsets = offsets_of(counts)
        reps = max(3, 200 // tokens)
        grouped = timed(lambda xs=xs, o=offsets: down.run(silu_and_mul(gate_up.run(xs, o)), o),
                        reps, clock(args))
        looped = timed(lambda xs=xs, c=counts: loop(xs, c), reps, clock(args))
        # what fusing the elementwise steps into the GEMMs could save at most
        g = gate_up.run(xs, offsets)
        silu = timed(lambda g=g: silu_and_mul(g), reps, clock(args))
        y = down.run(silu_and_mul(g), offsets)
        w = weights.reshape(-1)[order]
        combine = timed(lambda y=y, w=w, t=order // args.top_k, n=tokens: torch.zeros(
            n, args.hidden).index_add_(0, t, y * w.unsqueeze(1)), reps, clock(args))
        out[tokens] = {"grouped_ms": grouped, "per_expert_loop_ms": looped,
                       "speedup": looped / grouped, "silu_mul_ms": silu,
                       "weighted_combine_ms": combine,
                       **bf16_runs(args, w_gate_up, w_down, xs, counts, offsets, reps)}
    return out


def bf16_experts_of(args, w_gate_up, w_down):
    """The layer's experts held in bf16 for the grouped bf16 kernel (moe/grouped_bf16.py)."""
    from pagedllm.model.layers.moe import StackedExperts

    experts = StackedExperts(args.experts, args.hidden, args.expert_width).to(torch.bfloat16)
    experts.gate_up_proj.copy_(w_gate_up)
    experts.down_proj.copy_(w_down)
    experts.finalize()
    if not experts.bf16:
        raise RuntimeError("the grouped bf16 kernel is not built here")
    return experts.packed


def bf16_runs(args, w_gate_up, w_down, xs, counts, offsets, reps) -> dict:
    """The same rows through bf16 experts: the grouped bf16 kernel (fp32 rows in and out)
    and the per-expert torch loop in bf16 (bf16 rows, torch.mm's bf16 GEMM), ms per call."""
    from pagedllm.model.layers.activation import silu_and_mul

    gate_up, down = bf16_experts_of(args, w_gate_up, w_down)
    loop = per_expert_loop(w_gate_up.bfloat16(), w_down.bfloat16())
    grouped = timed(lambda: down.run(silu_and_mul(gate_up.run(xs, offsets)), offsets), reps,
                    clock(args))
    xb = xs.bfloat16()
    looped = timed(lambda: loop(xb, counts), reps, clock(args))
    return {"bf16_grouped_ms": grouped, "bf16_per_expert_loop_ms": looped,
            "bf16_speedup": looped / grouped}


@torch.inference_mode()
def bf16_threshold_runs(args) -> dict:
    """Every expert's group `m` rows, the gate|up projection: the bf16 kernel's exact path
    (x fp32, weights widened) against its dot-product path (x rounded to bf16, vdpbf16ps),
    ms per call; where the second wins is grouped_bf16.MIN_BF16_ROWS. {} without
    avx512_bf16."""
    from pagedllm.kernels import cpu_ops
    from pagedllm.model.layers.moe.grouped import offsets_of
    from pagedllm.model.layers.moe.grouped_bf16 import Bf16Experts, isas

    if "avx512_bf16" not in isas():
        return {}
    ops = cpu_ops.load()
    w = (torch.randn(args.experts, 2 * args.expert_width, args.hidden)
         * args.hidden ** -0.5).bfloat16()
    exact = Bf16Experts(ops, w, min_bf16_rows=1 << 30)
    dot = Bf16Experts(ops, w, min_bf16_rows=1)
    out = {}
    for m in (1, 2, 4, 8, 12, 16, 24, 32, 64, 128):
        xs = torch.randn(m * args.experts, args.hidden)
        offsets = offsets_of([m] * args.experts)
        reps = max(5, 400 // m)
        # interleaved A / B, so a busy machine's slow spells hit both
        a, b = [], []
        for _ in range(3):
            a.append(timed(lambda xs=xs, o=offsets: exact.run(xs, o), reps, clock(args)))
            b.append(timed(lambda xs=xs, o=offsets: dot.run(xs, o), reps, clock(args)))
        out[m] = {"exact_ms": statistics.median(a), "bf16_dot_ms": statistics.median(b),
                  "dot_speedup": statistics.median(a) / statistics.median(b)}
    return out


# ------------------------------------------------------------------ report
def table(res: dict) -> str:
    levels = res["args"]["levels"]
    engines = [e for e in ("moe", "dense", "dense-py", "gguf", "llama.cpp") if res.get(e)]
    lines = [f"{'engine':<12}" + "".join(f"{f'decode c={c}':>14}" for c in levels)
             + f"{'prefill':>12}"]
    for e in engines:
        r = res[e]
        lines.append(f"{e:<12}" + "".join(f"{r['decode'][c]['output_tok_s']:>14.1f}"
                                          for c in levels) + f"{r['prefill']['prefill_tok_s']:>12.1f}")
    for name, (a, b) in {"moe/dense": ("moe", "dense"), "moe/dense-py": ("moe", "dense-py"),
                         "gguf/llama.cpp": ("gguf", "llama.cpp")}.items():
        if res.get(a) and res.get(b):
            lines.append(f"{name:<12}" + "".join(
                f"{res[a]['decode'][c]['output_tok_s'] / res[b]['decode'][c]['output_tok_s']:>13.2f}x"
                for c in levels) + f"{res[a]['prefill']['prefill_tok_s'] / res[b]['prefill']['prefill_tok_s']:>11.2f}x")
    if res.get("interleaved"):
        r = res["interleaved"]
        lines += ["", f"one sequence, {r['rounds']} interleaved rounds: moe "
                  f"{r['moe_median_tok_s']:.1f} tok/s, dense {r['dense_median_tok_s']:.1f} tok/s, "
                  f"moe/dense median {r['median_ratio']:.2f}x "
                  f"(rounds {', '.join(f'{x:.2f}' for x in r['ratios'])})"]
    return "\n".join([*lines, "", layer_table(res)])


def layer_table(res: dict) -> str:
    """The layer workload's rows: fp32 grouped vs loop, bf16, the bf16 kernel's paths."""
    lines = [f"{'layer tokens':<14}{'grouped ms':>12}{'loop ms':>12}{'speedup':>10}"
             f"{'silu*up ms':>12}{'combine ms':>12}"]
    for t, r in res["layer"].items():
        lines.append(f"{t:<14}{r['grouped_ms']:>12.3f}{r['per_expert_loop_ms']:>12.3f}"
                     f"{r['speedup']:>9.2f}x{r['silu_mul_ms']:>12.3f}"
                     f"{r['weighted_combine_ms']:>12.3f}")
    lines.append("")
    lines.append(f"{'bf16 tokens':<14}{'grouped ms':>12}{'bf16 loop ms':>14}{'vs loop':>10}"
                 f"{'vs fp32 grouped':>17}")
    for t, r in res["layer"].items():
        lines.append(f"{t:<14}{r['bf16_grouped_ms']:>12.3f}{r['bf16_per_expert_loop_ms']:>14.3f}"
                     f"{r['bf16_speedup']:>9.2f}x{r['grouped_ms'] / r['bf16_grouped_ms']:>16.2f}x")
    if res.get("bf16_threshold"):
        lines.append("")
        lines.append(f"{'rows/expert':<14}{'exact ms':>12}{'bf16 dot ms':>13}{'dot speedup':>13}")
        for m, r in res["bf16_threshold"].items():
            lines.append(f"{m:<14}{r['exact_ms']:>12.3f}{r['bf16_dot_ms']:>13.3f}"
                         f"{r['dot_speedup']:>12.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    from benchmarks.peers import machine_info

    res: dict = {"machine": machine_info(), "args": vars(args).copy()}
    if args.only == "layer":
        return report_and_save(res, args, layer_only=True)
    paths = build_models(args)
    prompts = prompts_of(paths["moe"], max(args.levels), args.prompt_len)
    long_prompts = prompts_of(paths["moe"], args.prefill_reps, args.prefill_len)
    res["layer"] = layer_runs(args)
    runs = {"moe": ("moe", {}), "dense": ("dense", {}),
            "dense-py": ("dense", {"PAGEDLLM_FUSED_DECODE": "0"}), "gguf": ("gguf", {})}
    for name, (model, env) in runs.items():
        res[name] = pagedllm_runs(paths[model], args, prompts, long_prompts, env)
    if not args.no_llama_cpp:
        res["llama.cpp"] = llama_cpp_runs(paths["gguf"], args)
    if args.rounds:
        res["interleaved"] = interleaved_runs(paths, args, prompts[0])
    return report_and_save(res, args)


def interleaved_runs(paths: dict[str, Path], args, prompt: list[int]) -> dict:
    """One sequence (prompt -> output_len tokens) on the MoE and the dense model in turn,
    `rounds` times, both engines loaded in this process: the median of the per-round
    MoE / dense ratios, so a slow spell of a shared machine hits both sides of a ratio."""
    from benchmarks.peers_lib.workloads import new_llm
    from pagedllm import SamplingParams

    llms = {n: new_llm(str(paths[n]), args.threads, max_num_seqs=1, dtype=args.dtype)
            for n in ("moe", "dense")}
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0)
    request = [{"prompt_token_ids": prompt}]
    for llm in llms.values():  # warm-up
        llm.generate(request, params, use_tqdm=False)
    tok_s: dict[str, list[float]] = {n: [] for n in llms}
    for _ in range(args.rounds):
        for name, llm in llms.items():
            t0 = time.perf_counter()
            llm.generate(request, params, use_tqdm=False)
            tok_s[name].append(args.output_len / (time.perf_counter() - t0))
    ratios = [m / d for m, d in zip(tok_s["moe"], tok_s["dense"], strict=True)]
    return {"rounds": args.rounds, "tok_s": tok_s, "ratios": ratios,
            "median_ratio": statistics.median(ratios),
            **{f"{n}_median_tok_s": statistics.median(v) for n, v in tok_s.items()}}


def report_and_save(res: dict, args, layer_only: bool = False) -> dict:
    """Print the table and write the JSON (`layer_only`: the layer workloads are run here)."""
    if layer_only:
        res["layer"] = layer_runs(args)
    res["bf16_threshold"] = bf16_threshold_runs(args)
    res["machine"]["load_after"] = os.getloadavg()[0]
    report = layer_table(res) if layer_only else table(res)
    print(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2, default=str))
    logger.info("wrote %s", args.out)
    return res


if __name__ == "__main__":
    main()
