"""`pagedllm` command line: serve (OpenAI-compatible HTTP server), generate, chat."""

from __future__ import annotations

import argparse
import logging
import sys

from pagedllm.entrypoints.args import add_engine_args, add_server_args, engine_config_from_args


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--sampling-seed", dest="sample_seed", type=int, default=None)


def _params(args):
    from pagedllm import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                          top_p=args.top_p, top_k=args.top_k, seed=args.sample_seed)


def _engine(args):
    from pagedllm.engine.llm import LLM
    from pagedllm.engine.llm_engine import LLMEngine

    llm = LLM.__new__(LLM)
    llm.llm_engine = LLMEngine(engine_config_from_args(args), debug_steps=args.debug_steps)
    return llm


def cmd_generate(args) -> int:
    llm = _engine(args)
    outs = llm.generate(args.prompt, _params(args), use_tqdm=False)
    for out in outs:
        sys.stdout.write(f"{out.prompt!r} -> {out.outputs[0].text!r}\n")
    return 0


def cmd_chat(args) -> int:
    llm = _engine(args)
    history: list[dict[str, str]] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    sys.stdout.write("pagedllm chat (empty line or Ctrl-D to quit)\n")
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            break
        if not line:
            break
        history.append({"role": "user", "content": line})
        reply = llm.chat(history, _params(args), use_tqdm=False)[0].outputs[0].text
        history.append({"role": "assistant", "content": reply})
        sys.stdout.write(f"assistant> {reply}\n")
    return 0


def cmd_serve(args) -> int:
    from pagedllm.engine.async_engine import AsyncEngine, QueueLimits
    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.entrypoints.api_server import bind_socket, run_server

    # Everything that can be checked without the model is checked before loading it.
    limits = QueueLimits(args.max_num_queued_reqs, args.max_num_queued_tokens)
    if args.max_request_body_bytes < 1:
        raise ValueError(f"--max-request-body-bytes must be >= 1, got "
                         f"{args.max_request_body_bytes}")
    config = engine_config_from_args(args)
    sock = bind_socket(args.host, args.port)
    engine = LLMEngine(config, debug_steps=args.debug_steps)
    names = args.served_model_name or [engine.model_name]
    logging.getLogger(__name__).info("serving %s as %s on http://%s:%d%s", engine.model_name,
                                     ", ".join(names), args.host, args.port,
                                     " (API key required)" if args.api_key else "")
    return run_server(AsyncEngine(engine, names[0], limits), host=args.host, port=args.port,
                      served_model_names=names, api_key=args.api_key,
                      access_log=not args.disable_access_log,
                      max_request_body_bytes=args.max_request_body_bytes, sock=sock)


_KV_DTYPE_BYTES = {"auto": None, "float32": 4, "fp32": 4, "float16": 2, "fp16": 2,
                   "bfloat16": 2, "bf16": 2, "int8": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def cmd_plan(args) -> int:
    from pagedllm.memory_plan import load_config, plan

    if args.memory is None and args.kv_cache_memory is None:
        args.memory = 24.0
    result = plan(load_config(args.model_or_config), memory_gib=args.memory,
                  kv_cache_memory_gib=args.kv_cache_memory, max_model_len=args.max_model_len,
                  block_size=args.block_size, kv_dtype_bytes=_KV_DTYPE_BYTES[args.kv_cache_dtype],
                  utilization=args.gpu_memory_utilization)
    lines = result.lines()
    if args.max_num_seqs is not None:
        need = args.max_num_seqs * result.kv_bytes_per_seq
        verdict = "fits" if need <= result.kv_budget else "does NOT fit"
        lines.append(f"max_num_seqs {args.max_num_seqs} x max_model_len {result.max_model_len} "
                     f"needs {need / 2**30:.2f} GiB of KV: {verdict}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagedllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    add_engine_args(serve)
    add_server_args(serve)
    serve.set_defaults(func=cmd_serve)
    gen = sub.add_parser("generate", help="generate completions for prompts")
    add_engine_args(gen)
    gen.add_argument("--prompt", action="append", required=True, help="repeatable")
    _sampling_args(gen)
    gen.set_defaults(func=cmd_generate)
    chat = sub.add_parser("chat", help="interactive chat with the model's chat template")
    add_engine_args(chat)
    chat.add_argument("--system", default=None, help="system prompt")
    _sampling_args(chat)
    chat.set_defaults(func=cmd_chat)
    pl = sub.add_parser("plan", help="memory plan from a config.json (no weights needed)")
    pl.add_argument("model_or_config", help="config.json, model directory or .gguf file")
    pl.add_argument("--max-model-len", type=int, default=None)
    pl.add_argument("--max-num-seqs", type=int, default=None)
    pl.add_argument("--kv-cache-dtype", default="auto", choices=sorted(_KV_DTYPE_BYTES))
    pl.add_argument("--block-size", type=int, default=16)
    pl.add_argument("--memory", type=float, default=None,
                    help="device memory in GiB to plan for (default 24)")
    pl.add_argument("--kv-cache-memory", type=float, default=None,
                    help="KV cache budget in GiB (instead of --memory)")
    pl.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    pl.set_defaults(func=cmd_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command. A fatal error (model not found, KV budget too small, max_model_len too
    long, port in use, ...) is one line on stderr and exit status 1; its traceback is logged
    only with --log-level debug."""
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "info")
    logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the CLI's last word on any fatal error
        if level == "debug":
            logging.getLogger(__name__).exception("fatal error")
        message = " ".join(str(exc).split()) or type(exc).__name__
        sys.stderr.write(f"pagedllm: error: {message}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
