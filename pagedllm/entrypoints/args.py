"""Engine flags shared by every CLI command (vLLM names)."""

from __future__ import annotations

import argparse
import os

from pagedllm.config import (
    KV_CACHE_DTYPES,
    PREEMPTION_MODES,
    QUANTIZATION_METHODS,
    EngineConfig,
)
from pagedllm.entrypoints.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES
from pagedllm.model.layers.rope_scaling import parse_rope_scaling
from pagedllm.sampling_params import MAX_LOGPROBS


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
    g.add_argument("--rope-scaling", type=_rope_scaling, default=None,
                   help="JSON replacing the model's rope scaling, e.g. "
                   "'{\"rope_type\": \"yarn\", \"factor\": 4.0}' (linear, dynamic, yarn, llama3)")
    g.add_argument("--rope-theta", type=float, default=None, help="override the RoPE base")
    g.add_argument("--allow-long-max-model-len", action="store_true",
                   help="allow --max-model-len beyond the model's RoPE maximum (with a warning)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=True, help="reuse the KV blocks of prompt prefixes computed before "
                   "(default: on; --no-enable-prefix-caching turns it off)")
    g.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *KV_CACHE_DTYPES],
                   help="KV cache storage: auto (the model dtype), int8 or fp8 (= fp8_e4m3), "
                   "fp8_e5m2; 8-bit caches hold ~2x (vs fp16) or ~4x (vs fp32) the tokens, with "
                   "a scale per token per KV head")
    g.add_argument("--preemption-mode", default="recompute", choices=PREEMPTION_MODES,
                   help="when KV blocks run out: recompute (free the victim's blocks, prefill "
                   "again later) or swap (copy them to --swap-space CPU memory and back)")
    g.add_argument("--swap-space", type=float, default=4.0,
                   help="GiB of CPU memory for swapped-out KV blocks with --preemption-mode "
                   "swap (default 4; 0 disables: every preemption recomputes)")
    g.add_argument("--quantization", default=None, choices=QUANTIZATION_METHODS,
                   help="weight format: gguf, awq, gptq (kept quantized in memory), int8 "
                   "(weight-only int8 made at load), none (dequantize to --dtype, the reference); "
                   "default: what the checkpoint holds")
    g.add_argument("--int8-activations", action="store_true",
                   help="with --quantization int8: W8A8, int8 activations quantized per token "
                   "and integer dot products (faster for big batches; close, not exact)")
    g.add_argument("--max-num-seqs", type=int, default=256)
    g.add_argument("--max-num-batched-tokens", type=int, default=None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    g.add_argument("--max-logprobs", type=int, default=MAX_LOGPROBS,
                   help=f"largest logprobs / top_logprobs a request may ask for (default "
                   f"{MAX_LOGPROBS})")
    g.add_argument("--debug-steps", action="store_true",
                   help="log one line per engine step with timings")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="logging level; with debug a fatal error also prints its traceback")


def _rope_scaling(text: str) -> dict | None:
    try:
        return parse_rope_scaling(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_server_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--api-key", default=os.environ.get("PAGEDLLM_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize "
                   "(default: $PAGEDLLM_API_KEY)")
    g.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use for the model; the first appears in responses "
                   "(default: the model argument)")
    g.add_argument("--disable-access-log", action="store_true", help="no per-request log line")
    g.add_argument("--max-num-queued-reqs", type=int, default=None,
                   help="refuse new requests (429 + Retry-After) while this many wait to be "
                   "scheduled (default: unbounded)")
    g.add_argument("--max-num-queued-tokens", type=int, default=None,
                   help="refuse new requests (429) that would bring the waiting requests' "
                   "prompt tokens past this (default: unbounded)")
    g.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                   help="refuse larger request bodies (413) before parsing them (default "
                   f"{DEFAULT_MAX_REQUEST_BODY_BYTES // 2**20} MiB)")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model_flag or args.model, dtype=args.dtype, device=args.device,
        block_size=args.block_size, kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        seed=args.seed, num_threads=args.num_threads, rope_scaling=args.rope_scaling,
        rope_theta=args.rope_theta, allow_long_max_model_len=args.allow_long_max_model_len,
        enable_prefix_caching=args.enable_prefix_caching, kv_cache_dtype=args.kv_cache_dtype,
        preemption_mode=args.preemption_mode, swap_space=args.swap_space,
        quantization=args.quantization, int8_activations=args.int8_activations,
        max_logprobs=args.max_logprobs)
