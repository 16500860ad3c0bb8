"""CUDA benchmark (run on a GPU, by scripts/gpu_check.sh): SmolLM2-135M shapes in bf16.

    python benchmarks/gpu.py --model-dir .gpu/smollm2 --out $OUT/gpu_bench.json

`--model-dir` holds SmolLM2-135M-Instruct's config.json and tokenizer; without weights in it
the script writes random bf16 weights of those shapes (the real checkpoint does not travel
to a lent GPU: its GGUF is 98 MB, over the 64 MiB a device call carries). Speed does not
depend on the weights' values: every request runs to max_tokens (ignore_eos).

Measures, each beside its floor:
  decode step at batch 1 / 8 / 64, CUDA graphs on and off (--enforce-eager): median wall
      time of engine.step() over 32 decode steps at context ~128 (schedule, forward, sample,
      outputs: what a user waits for per token); floor = weight bytes / HBM bandwidth
  prefill of one 2,048-token prompt: one step; floor = 2 x params x tokens / bf16 peak
  both also with PAGEDLLM_ATTENTION_BACKEND=torch (the fallback the Triton kernels replace)
  offline 256 requests x (128 in / 128 out): LLM.generate output tokens per second, KV pool
      sized by the profiling pass (gpu_memory_utilization 0.5)
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import time
from pathlib import Path

import torch

from pagedllm import LLM, SamplingParams
from pagedllm.engine.llm_engine import LLMEngine

logger = logging.getLogger("gpu_bench")


def ensure_weights(model_dir: Path) -> None:
    if any(model_dir.glob("*.safetensors")):
        return
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.save_pretrained(model_dir, safe_serialization=True)
    del model
    torch.cuda.empty_cache()


VOCAB = [49152]


def prompt(i: int, n: int) -> list[int]:
    """Distinct prompts per i (different first tokens: no shared prefixes)."""
    v = VOCAB[0] - 4
    return [4 + (i * 31 + j * 7 + (i * n if j == 0 else 0)) % v for j in range(n)]


def decode_steps(engine: LLMEngine, batch: int, steps: int = 32) -> float:
    """Median ms of a pure decode step of `batch` sequences at context ~128."""
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    for i in range(batch):
        engine.add_request(prompt(i, 128), params, f"d{batch}-{i}")
    while engine.stats.last is None or engine.stats.last.decode_seqs != batch:
        engine.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    for i in range(batch):
        engine.abort_request(f"d{batch}-{i}")
    while engine.has_unfinished_requests():
        engine.step()
    return 1e3 * statistics.median(times)


def profile_eager(engine: LLMEngine, steps: int, path: Path) -> None:
    """cProfile of `steps` eager decode steps of one sequence: the functions by own time and
    by cumulative time (an eager step's ~13 ms on an H200 is host time: a graph replays it in
    1.6 ms)."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    decode_steps(engine, 1, steps)
    prof.disable()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.getvalue())
    logger.info("eager decode profile (%d steps) written to %s", steps, path)


def free(*objs) -> None:
    del objs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu.json"))
    ap.add_argument("--hbm-gbps", type=float, default=4800.0, help="H200: 4.8 TB/s")
    ap.add_argument("--bf16-tflops", type=float, default=989.0, help="H200 dense bf16")
    ap.add_argument("--quick", action="store_true", help="fewer requests (smoke test)")
    ap.add_argument("--device", default="cuda", help="cuda; cpu only smoke-tests the script")
    ap.add_argument("--profile-eager", type=int, default=0, metavar="STEPS",
                    help="also cProfile STEPS eager batch-1 decode steps (where the host time "
                    "of an eager step goes: Python, Triton's launcher, torch) into "
                    "gpu_eager_profile.txt beside --out")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    ensure_weights(args.model_dir)
    VOCAB[0] = json.loads((args.model_dir / "config.json").read_text())["vocab_size"]
    cuda = args.device == "cuda"
    results: dict = {"device": torch.cuda.get_device_name() if cuda else "cpu",
                     "torch": torch.__version__}
    dtype = "bfloat16" if cuda else "float32"
    common = dict(model=str(args.model_dir), dtype=dtype, device=args.device,
                  max_model_len=4096, max_num_seqs=64,
                  kv_cache_memory=(8 if cuda else 1) * 2**30)

    decode: dict = {}
    prefill_ms: dict = {}
    # (name, enforce_eager, attention backend): the torch backend is the fallback the Triton
    # kernels replace (gathered KV, SDPA with a [P, q, L] mask), measured beside them.
    for key, eager, backend in (("cuda_graphs", False, "auto"), ("eager", True, "auto"),
                                ("torch_backend_eager", True, "torch")):
        os.environ["PAGEDLLM_ATTENTION_BACKEND"] = backend
        engine = LLMEngine.from_engine_args(enforce_eager=eager, **common)
        results[f"{key}_captured"] = engine.runner.graphs is not None  # False off CUDA
        params_n = sum(p.numel() for p in engine.model.parameters())
        weight_bytes = sum(p.numel() * p.element_size() for p in engine.model.parameters())
        decode_steps(engine, 1, 8)  # warm-up (Triton compiles, allocator)
        decode[key] = {b: decode_steps(engine, b) for b in (1, 8, 64)}
        logger.info("decode step ms (%s): %s", key, decode[key])
        if key == "eager" and args.profile_eager:
            profile_eager(engine, args.profile_eager, args.out.parent / "gpu_eager_profile.txt")
        # prompts no earlier request shares a prefix with (no prefix-cache hits)
        engine.add_request(prompt(5000, 2048), SamplingParams(max_tokens=1), "warm")
        while engine.has_unfinished_requests():
            engine.step()
        engine.add_request(prompt(5001, 2048), SamplingParams(max_tokens=1), "p2048")
        t0 = time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
        prefill_ms[key] = 1e3 * (time.perf_counter() - t0)
        free(engine)
    os.environ["PAGEDLLM_ATTENTION_BACKEND"] = "auto"
    floor_decode_ms = weight_bytes / (args.hbm_gbps * 1e9) * 1e3
    floor_prefill_ms = 2 * params_n * 2048 / (args.bf16_tflops * 1e12) * 1e3
    results["weights"] = {"parameters": params_n, "bytes": weight_bytes}
    results["decode_step_ms"] = decode
    results["decode_floor_ms"] = floor_decode_ms
    results["prefill_2048"] = {"ms": prefill_ms, "floor_ms": floor_prefill_ms}

    n = 32 if args.quick else 256
    llm = LLM(str(args.model_dir), dtype=dtype, device=args.device, max_model_len=4096,
              max_num_seqs=256, gpu_memory_utilization=0.5,
              kv_cache_memory=None if cuda else 2**30)
    params = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    llm.generate([{"prompt_token_ids": prompt(10_000 + i, 128)} for i in range(16)], params,
                 use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": prompt(i, 128)} for i in range(n)], params,
                        use_tqdm=False)
    wall = time.perf_counter() - t0
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    engine = llm.llm_engine
    results["offline"] = {"requests": n, "output_tokens": out_tokens, "wall_s": wall,
                          "output_tok_s": out_tokens / wall,
                          "kv_blocks": engine.num_blocks,
                          "cuda_graph_replays": getattr(engine.runner.graphs, "replays", 0)}
    free(llm, engine)

    print(f"\n{'':28s} {'measured':>10s} {'floor':>10s}")
    for key, row in decode.items():
        for b, ms in row.items():
            print(f"decode step b={b:<3d} {key:<12s} {ms:8.3f} ms {floor_decode_ms:8.3f} ms")
    for key, ms in prefill_ms.items():
        print(f"prefill 2048 {key:<15s} {ms:8.3f} ms {floor_prefill_ms:8.3f} ms "
              f"({2048 / ms * 1e3:.0f} tok/s)")
    o = results["offline"]
    print(f"offline {n} x (128/128)      {o['output_tok_s']:8.0f} output tok/s "
          f"in {o['wall_s']:.1f} s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
