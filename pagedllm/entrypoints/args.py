"""Engine flags shared by every CLI command (vLLM names and meanings).

Sizes: token counts (--max-model-len, --max-num-batched-tokens) take vLLM's human-readable
forms, 4k = 4000 and 4K = 4096 (also m/M, g/G); --kv-cache-memory is bytes, or a size with a
unit (4GiB, 512MiB, 1.5G); --swap-space is GiB, or a size with a unit.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING

from pagedllm.config.pooler import CONVERTS, RUNNERS
from pagedllm.config.vocabulary import (
    DEFAULT_MAX_REQUEST_BODY_BYTES,
    KV_CACHE_DTYPES,
    PREEMPTION_MODES,
    QUANTIZATION_METHODS,
    SCHEDULING_POLICIES,
)
from pagedllm.entrypoints import arg_types
from pagedllm.entrypoints.chat_options import add_chat_option_args
from pagedllm.entrypoints.server_options import add_server_option_args
from pagedllm.sampling_params import MAX_LOGPROBS

if TYPE_CHECKING:
    from pagedllm.config import EngineConfig


def add_engine_args(parser: argparse.ArgumentParser, model_positional: bool = True) -> None:
    if model_positional:
        parser.add_argument("model", nargs="?", default=None,
                            help="HF model directory, .gguf file or Hub name Org/Model "
                            "(default: SmolLM2-135M-Instruct)")
    parser.add_argument("--model", dest="model_flag", default=None, help=argparse.SUPPRESS)
    g = parser.add_argument_group("engine")
    g.add_argument("--dtype", default="auto", help="auto (CPU: bf16 linear weights under fp32 "
                   "compute where the CPU has avx512_bf16 / amx_bf16 and the weights are float, "
                   "else fp32; CUDA: bf16), float32, float16, bfloat16 (on CPU: bf16 linear "
                   "weights, fp32 compute)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    g.add_argument("--kv-cache-memory", default=None, type=arg_types.size,
                   help="KV cache budget: bytes, or a size with a unit (4GiB, 512MiB); "
                   "None = 2GiB on CPU, on CUDA what --gpu-memory-utilization leaves")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="share of CUDA device memory for weights, activations and KV cache")
    g.add_argument("--max-model-len", type=arg_types.human_int, default=None,
                   help="context length (prompt + output), e.g. 2048, 4k (4000), 4K (4096); "
                   "None = the model's trained length")
    g.add_argument("--rope-scaling", type=arg_types.rope_scaling, default=None,
                   help="JSON replacing the model's rope scaling, e.g. "
                   "'{\"rope_type\": \"yarn\", \"factor\": 4.0}' (linear, dynamic, yarn, llama3, longrope)")
    g.add_argument("--rope-theta", type=float, default=None, help="override the RoPE base")
    g.add_argument("--allow-long-max-model-len", action="store_true",
                   help="allow --max-model-len beyond the model's RoPE maximum (with a warning)")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=True, help="reuse the KV blocks of prompt prefixes computed before "
                   "(--no-enable-prefix-caching turns it off)")
    g.add_argument("--disable-hybrid-kv-cache-manager", action="store_true",
                   help="keep sliding-window layers' KV for the whole sequence like full "
                   "attention (one block table; by default their out-of-window blocks are freed)")
    g.add_argument("--runner", default="auto", choices=RUNNERS,
                   help="generate, or pooling (embeddings / scores: /v1/embeddings, /pooling, "
                   "/score, /rerank); auto: pooling for *ForSequenceClassification checkpoints")
    g.add_argument("--convert", default="auto", choices=CONVERTS,
                   help="with --runner pooling: embed (a decoder's pooled hidden state) or "
                   "classify (a *ForSequenceClassification score head); auto picks by checkpoint")
    g.add_argument("--pooler-config", type=arg_types.pooler_config, default=None,
                   help="JSON, e.g. '{\"pooling_type\": \"MEAN\", \"normalize\": true}' "
                   "(pooling_type LAST | MEAN | CLS, normalize, activation)")
    g.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *KV_CACHE_DTYPES],
                   help="KV cache storage: auto (the model dtype), int8 or fp8 (= fp8_e4m3), "
                   "fp8_e5m2; 8-bit caches hold ~2x (vs fp16) or ~4x (vs fp32) the tokens, with "
                   "a scale per token per KV head")
    g.add_argument("--preemption-mode", default="recompute", choices=PREEMPTION_MODES,
                   help="when KV blocks run out: recompute (free the victim's blocks, prefill "
                   "again later) or swap (copy them to --swap-space CPU memory and back)")
    g.add_argument("--scheduling-policy", default="fcfs", choices=SCHEDULING_POLICIES,
                   help="order of waiting requests: fcfs (arrival) or priority (the request's "
                   "`priority`, lower first, then arrival; preemption picks the "
                   "lowest-priority running request)")
    g.add_argument("--swap-space", type=arg_types.gib, default=4.0,
                   help="CPU memory for swapped-out KV blocks with --preemption-mode swap: GiB, "
                   "or a size with a unit (512MiB); 0 disables (every preemption recomputes)")
    g.add_argument("--revision", default=None,
                   help="Hub models: branch, tag or commit to load (default main)")
    g.add_argument("--tokenizer", default=None,
                   help="directory or Hub name of the tokenizer (default: the model's)")
    g.add_argument("--download-dir", default=None,
                   help="HF cache directory for Hub models (default: $HF_HUB_CACHE, "
                   "$HF_HOME/hub or ~/.cache/huggingface/hub)")
    g.add_argument("--chat-template", default=None,
                   help="chat template (a Jinja file, or the template itself) replacing the "
                   "model's; needed for chat with models that have none (base models)")
    g.add_argument("--quantization", default=None, choices=QUANTIZATION_METHODS,
                   help="weight format: gguf, awq, gptq (kept quantized in memory), int8 "
                   "(weight-only int8 made at load), none (dequantize to --dtype, the "
                   "reference); None = what the checkpoint holds")
    g.add_argument("--int8-activations", action=argparse.BooleanOptionalAction, default=None,
                   help="int8 activations and integer dot products (close, not exact): with "
                   "--quantization int8 W8A8, on a GGUF model its blocks (both with a scale "
                   "per 32 activation values, llama.cpp's scheme). Default: on on CPU where the "
                   "kernels have SIMD int8 dot products (AVX2, AVX-512, VNNI), else off; "
                   "--no-int8-activations: the exact path")
    g.add_argument("--max-num-seqs", type=int, default=256,
                   help="most sequences in one batch")
    g.add_argument("--num-scheduler-steps", type=int, default=8,
                   help="decode steps one engine step may run in one call to the model (CPU, "
                   "Llama-family models, batches of greedy decodes, fewer for larger "
                   "batches; 1 = one step at a time; default 8)")
    g.add_argument("--max-num-batched-tokens", type=arg_types.human_int, default=None,
                   help="token budget of one step (None = 2048)")
    g.add_argument("--seed", type=int, default=0, help="random seed")
    g.add_argument("--num-threads", type=int, default=None,
                   help="torch CPU threads (None = torch's default)")
    g.add_argument("--generation-config", default="auto",
                   help="sampling defaults: auto reads temperature/top_p/top_k/min_p/"
                   "repetition_penalty from the model's generation_config.json (a request's "
                   "own values win), vllm ignores the file, or a folder holding one")
    g.add_argument("--tensor-parallel-size", "-tp", type=arg_types.parallel_size, default=1,
                   help="worker processes each holding 1/N of every layer (torch.distributed: "
                   "gloo on CPU, NCCL on CUDA); on CPU each uses cores/N threads")
    g.add_argument("--enable-expert-parallel", action=argparse.BooleanOptionalAction,
                   default=None,
                   help="with -tp N on a mixture-of-experts model: each rank holds E/N whole "
                   "experts and runs the tokens routed to them (--no-enable-expert-parallel: "
                   "1/N of every expert's width); default: whole experts when N divides E")
    g.add_argument("--data-parallel-size", "-dp", type=arg_types.parallel_size, default=1,
                   help="engine replicas (processes) behind one API server, requests routed "
                   "to the least loaded with prefix-cache affinity (serve only)")
    g.add_argument("--distributed-executor-backend", default=None, choices=["mp", "ray"],
                   help="how tensor-parallel workers and data-parallel replicas start: mp "
                   "(local processes, default) or ray (Ray actors in a placement group; "
                   "$RAY_ADDRESS or a local cluster; pip install 'pagedllm[ray]')")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for vLLM compatibility; pagedllm never runs code from a "
                   "model repository (its own model implementations only)")
    g.add_argument("--enforce-eager", action="store_true",
                   help="on CUDA, run every step eagerly: no CUDA graphs for decode batches "
                   "(captured at start-up for batch sizes 1, 2, 4, ... up to --max-num-seqs); "
                   "nothing to turn off on CPU")
    g.add_argument("--max-logprobs", type=int, default=MAX_LOGPROBS,
                   help="largest logprobs / top_logprobs a request may ask for")
    g.add_argument("--debug-steps", action="store_true",
                   help="log one line per engine step with timings")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="logging level; with debug a fatal error also prints its traceback")
    sg = parser.add_argument_group("speculative decoding")
    sg.add_argument("--speculative-config", type=arg_types.speculative_config, default=None,
                    help='JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4, '
                    '"prompt_lookup_max": 4, "prompt_lookup_min": 2}\' or \'{"method": '
                    '"draft_model", "model": PATH, "num_speculative_tokens": 3}\'')
    lg = parser.add_argument_group("LoRA")
    lg.add_argument("--enable-lora", action="store_true",
                    help="serve PEFT LoRA adapters per request (several in one batch)")
    lg.add_argument("--max-loras", type=int, default=1,
                    help="adapters in one batch (device slots; default 1)")
    lg.add_argument("--max-lora-rank", type=int, default=16,
                    help="highest adapter rank accepted; slots are allocated at it (default 16)")
    lg.add_argument("--max-cpu-loras", type=int, default=None,
                    help="adapters kept loaded in CPU memory (default: --max-loras)")


def add_server_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on")
    g.add_argument("--port", type=int, default=8000, help="port to listen on")
    g.add_argument("--api-key", default=os.environ.get("PAGEDLLM_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' on /v1/*, /tokenize, /detokenize "
                   "(default: $PAGEDLLM_API_KEY; the chat page asks for it)")
    g.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use for the model; the first appears in responses "
                   "(default: the model argument)")
    g.add_argument("--disable-access-log", action="store_true",
                   help="no uvicorn access log line per HTTP request")
    g.add_argument("--disable-log-requests", action="store_true",
                   help="no log line per accepted generation request (vLLM's flag)")
    add_chat_option_args(g)  # tool-call parser, structured output strictness
    g.add_argument("--max-num-queued-reqs", type=int, default=None,
                   help="refuse new requests (429 + Retry-After) while this many wait to be "
                   "scheduled (None: unbounded)")
    g.add_argument("--max-num-queued-tokens", type=int, default=None,
                   help="refuse new requests (429) that would bring the waiting requests' "
                   "prompt tokens past this (None: unbounded)")
    g.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                   help="refuse larger request bodies (413) before parsing them (default "
                   f"{DEFAULT_MAX_REQUEST_BODY_BYTES // 2**20} MiB)")
    g.add_argument("--metrics-vllm-compat", action="store_true",
                   help="/metrics also exports each series under vLLM's name (vllm:...), for "
                   "dashboards built for vLLM")
    g.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"],
                   help="log level of uvicorn's own messages")
    g.add_argument("--lora-modules", nargs="+", type=arg_types.parse_lora_module, default=None,
                   metavar="NAME=PATH", help="LoRA adapters served under their names (the "
                   "request's `model` picks one; needs --enable-lora); also vLLM's JSON form "
                   "'{\"name\": ..., \"path\": ...}'")
    add_server_option_args(g)  # limits, timeouts, shutdown, hosts


def check_vllm_only_args(args: argparse.Namespace) -> None:
    """Say what the vLLM flags that change nothing here mean for pagedllm."""
    log = logging.getLogger(__name__)
    if getattr(args, "trust_remote_code", False):
        log.info("--trust-remote-code: accepted; no code from a model repository is ever run "
                 "(pagedllm uses its own model implementations)")


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    from pagedllm.config import EngineConfig

    check_vllm_only_args(args)
    return EngineConfig(
        model=args.model_flag or args.model, dtype=args.dtype, device=args.device,
        block_size=args.block_size, kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        seed=args.seed, num_threads=args.num_threads, rope_scaling=args.rope_scaling,
        rope_theta=args.rope_theta, allow_long_max_model_len=args.allow_long_max_model_len,
        enable_prefix_caching=args.enable_prefix_caching, kv_cache_dtype=args.kv_cache_dtype,
        preemption_mode=args.preemption_mode, swap_space=args.swap_space,
        scheduling_policy=args.scheduling_policy,
        generation_config=args.generation_config, quantization=args.quantization,
        int8_activations=args.int8_activations, max_logprobs=args.max_logprobs,
        enable_lora=args.enable_lora, max_loras=args.max_loras,
        max_lora_rank=args.max_lora_rank, max_cpu_loras=args.max_cpu_loras,
        chat_template=args.chat_template, revision=args.revision, tokenizer=args.tokenizer,
        download_dir=args.download_dir, tensor_parallel_size=args.tensor_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel,
        data_parallel_size=args.data_parallel_size,
        distributed_executor_backend=args.distributed_executor_backend,
        speculative_config=getattr(args, "speculative_config", None),
        num_scheduler_steps=args.num_scheduler_steps,
        enforce_eager=args.enforce_eager,
        disable_hybrid_kv_cache_manager=args.disable_hybrid_kv_cache_manager,
        runner=args.runner, convert=args.convert, pooler_config=args.pooler_config)
