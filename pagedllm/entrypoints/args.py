"""Engine flags shared by every CLI command (vLLM names)."""

from __future__ import annotations

import argparse

from pagedllm.config import EngineConfig


def add_engine_args(parser: argparse.ArgumentParser, model_positional: bool = True) -> None:
    if model_positional:
        parser.add_argument("model", nargs="?", default=None,
                            help="HF model directory or .gguf file (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--model", dest="model_flag", default=None, help=argparse.SUPPRESS)
    g = parser.add_argument_group("engine")
    g.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16 on CUDA), float32, "
                   "float16, bfloat16")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--kv-cache-memory", default=None,
                   help="KV cache budget in bytes or with a suffix (4GiB); CPU default 2GiB")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    g.add_argument("--max-model-len", type=int, default=None)
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--max-num-batched-tokens", type=int, default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    g.add_argument("--debug-steps", action="store_true",
                   help="log one line per engine step with timings")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model_flag or args.model, dtype=args.dtype, device=args.device,
        block_size=args.block_size, kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        seed=args.seed, num_threads=args.num_threads)
