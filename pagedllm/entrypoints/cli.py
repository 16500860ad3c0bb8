"""`pagedllm` command line: serve (OpenAI-compatible HTTP server), generate, chat, plan,
bench, finetune, build-kernels. `python -m pagedllm` is the same command."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from pagedllm.entrypoints.arg_types import number_lora_modules
from pagedllm.entrypoints.args import add_engine_args, add_server_args, engine_config_from_args

logger = logging.getLogger(__name__)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows every flag's default (but never the API key taken from the environment)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.dest == "api_key" or "(default" in (action.help or ""):
            return action.help  # never the env's key; a default the help already states
        return super()._get_help_string(action)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling (the request's; --seed seeds it)")
    g.add_argument("--max-tokens", type=int, default=128, help="tokens to generate")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling")
    g.add_argument("--top-k", type=int, default=0, help="0 = off")


def _params(args):
    from pagedllm import SamplingParams

    return SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                          top_p=args.top_p, top_k=args.top_k, seed=args.seed)


def _lora_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora", default=None, metavar="ADAPTER_DIR",
                   help="a PEFT LoRA adapter applied to every prompt (turns on --enable-lora; "
                   "--max-lora-rank grows to the adapter's rank)")


def _cli_lora(args):
    """The --lora adapter as a request (None without one); sets the engine's LoRA capacity
    so that one adapter of any rank fits. Errors are one line (the adapter is read now)."""
    if not args.lora:
        return None
    from pagedllm.lora.adapter import AdapterError, read_adapter_config
    from pagedllm.lora.request import LoRARequest

    try:
        cfg = read_adapter_config(args.lora, "--lora")
    except AdapterError as e:
        raise SystemExit(f"pagedllm {args.command}: error: {e}") from None
    args.enable_lora = True
    args.max_lora_rank = max(args.max_lora_rank, cfg.max_rank)
    return LoRARequest("cli-adapter", 1, args.lora)


def _refuse_early(config) -> None:
    """Incompatible flags fail here, before the checkpoint, the kernels or any weight is
    loaded (tensor parallelism with quantized weights, LoRA or speculative decoding)."""
    from pagedllm.distributed.executor import check_tensor_parallel, weight_format_before_loading

    if config.tensor_parallel_size > 1:
        check_tensor_parallel(config, weight_format_before_loading(config))


def _engine(args):
    from pagedllm.engine.llm import LLM
    from pagedllm.engine.llm_engine import LLMEngine

    lora = _cli_lora(args)
    config = engine_config_from_args(args)
    _refuse_early(config)
    if config.data_parallel_size > 1:
        raise SystemExit("--data-parallel-size > 1 runs replicas behind `pagedllm serve` only")
    return LLM(engine=LLMEngine(config, debug_steps=args.debug_steps)), lora


def cmd_generate(args) -> int:
    """The generated text, one completion after another (a blank line between prompts); with
    --json one JSON object per prompt and line."""
    llm, lora = _engine(args)
    outs = llm.generate(args.prompt, _params(args), use_tqdm=False, lora_request=lora)
    for i, out in enumerate(outs):
        c = out.outputs[0]
        if args.json:
            sys.stdout.write(json.dumps({
                "prompt": out.prompt, "text": c.text, "token_ids": list(c.token_ids),
                "finish_reason": c.finish_reason,
                "prompt_tokens": len(out.prompt_token_ids)}) + "\n")
        else:
            sys.stdout.write(("\n" if i else "") + c.text + "\n")
    return 0


def cmd_chat(args) -> int:
    llm, lora = _engine(args)
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
        reply = llm.chat(history, _params(args), use_tqdm=False,
                         lora_request=lora)[0].outputs[0].text
        history.append({"role": "assistant", "content": reply})
        sys.stdout.write(f"assistant> {reply}\n")
    return 0


def cmd_serve(args) -> int:
    from pagedllm.engine.async_engine import AsyncEngine, QueueLimits
    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.entrypoints.api_server import bind_socket
    from pagedllm.kernels import cpu_ops
    from pagedllm.startup import warm_up

    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise SystemExit("--enable-auto-tool-choice needs --tool-call-parser")
    try:
        lora_modules = number_lora_modules(args.lora_modules)
    except ValueError as e:
        raise SystemExit(f"pagedllm serve: error: {e}") from None
    if lora_modules and not args.enable_lora:
        raise SystemExit("pagedllm serve: error: --lora-modules needs --enable-lora")
    # Everything that can be checked without the model is checked before loading it.
    limits = QueueLimits(args.max_num_queued_reqs, args.max_num_queued_tokens)
    if args.max_request_body_bytes < 1:
        raise ValueError(f"--max-request-body-bytes must be >= 1, got "
                         f"{args.max_request_body_bytes}")
    config = engine_config_from_args(args)
    _refuse_early(config)
    if config.data_parallel_size > 1:
        if lora_modules or not limits.unbounded:
            raise SystemExit("pagedllm serve: error: --data-parallel-size > 1 does not support "
                             "--lora-modules or --max-num-queued-* yet")
        return _serve_data_parallel(args, config)
    sock = bind_socket(args.host, args.port)

    def load() -> LLMEngine:
        engine = LLMEngine(config, debug_steps=args.debug_steps)
        for m in lora_modules:  # validate now: a bad adapter fails the start, not a request
            try:
                engine.load_lora(m)
            except ValueError as e:
                raise SystemExit(f"pagedllm serve: error: --lora-modules {m.lora_name}: "
                                 f"{e}") from None
        warm_up(engine)  # before /health answers 200
        return engine

    # Loaded in a passing thread and never stepped here: the engine thread that runs every
    # step is then the only one with OpenMP workers (cpu_ops.run_in_passing_thread says why).
    engine = cpu_ops.run_in_passing_thread(load)
    cpu_ops.release_thread_team()
    names = args.served_model_name or [engine.model_name]
    logger.info("serving %s as %s on http://%s:%d%s (chat page at /)", engine.model_name,
                ", ".join(names), args.host, args.port,
                " (API key required)" if args.api_key else "")
    try:
        return _run(args, AsyncEngine(engine, names[0], limits), names, sock, lora_modules)
    finally:
        engine.shutdown()  # tensor-parallel workers


def _run(args, engine, names, sock, lora_modules) -> int:
    from pagedllm.entrypoints.api_server import run_server
    from pagedllm.entrypoints.chat_options import ChatOptions
    from pagedllm.entrypoints.server_options import ServerOptions

    return run_server(engine, host=args.host, port=args.port,
                      served_model_names=names, api_key=args.api_key,
                      access_log=not args.disable_access_log,
                      max_request_body_bytes=args.max_request_body_bytes, sock=sock,
                      chat_options=ChatOptions.from_args(args),
                      lora_modules=lora_modules,
                      log_requests=not args.disable_log_requests,
                      uvicorn_log_level=args.uvicorn_log_level,
                      metrics_vllm_compat=args.metrics_vllm_compat,
                      options=ServerOptions.from_args(args))


def _serve_data_parallel(args, config) -> int:
    """`serve --data-parallel-size N`: N replica processes behind this server."""
    from pagedllm.data_parallel.client import DPEngine
    from pagedllm.data_parallel.metrics import DPCollector
    from pagedllm.engine.async_engine import AsyncEngine
    from pagedllm.entrypoints.api_server import bind_socket

    sock = bind_socket(args.host, args.port)
    engine = DPEngine(config, debug_steps=args.debug_steps)
    names = args.served_model_name or [engine.model_name]
    front = AsyncEngine(engine, names[0])
    front.metrics.registry.register(DPCollector(names[0], engine.router))
    logger.info("serving %s as %s on http://%s:%d with %d data-parallel replicas",
                engine.model_name, ", ".join(names), args.host, args.port,
                config.data_parallel_size)
    try:
        return _run(args, front, names, sock, [])
    finally:
        engine.shutdown()


def cmd_plan(args) -> int:
    """The engine's own numbers for this model and these flags, without loading weights."""
    import torch

    from pagedllm.memory_plan import load_config, plan_for_engine

    model = args.model_flag or args.model
    if model is None:
        from pagedllm.loader import default_model_path

        model = str(default_model_path())
    config = engine_config_from_args(args)
    if config.torch_device.type == "cuda" and not torch.cuda.is_available() \
            and args.dtype == "auto":
        config.torch_dtype = torch.bfloat16  # what "auto" resolves to on bf16-capable GPUs
        config.linear_dtype = torch.bfloat16
        if args.kv_cache_dtype == "auto":
            config.torch_kv_cache_dtype = torch.bfloat16
    memory = None if args.memory is None else _memory_bytes(args.memory)
    try:
        model_config = load_config(model)
        result = plan_for_engine(model_config, config, memory_bytes=memory)
    except ValueError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    archs = ", ".join(getattr(model_config, "architectures", None) or []) or "?"
    lines = [f"model:              {model} ({archs})", *result.lines()]
    need = config.max_num_seqs * result.kv_bytes_per_seq
    verdict = "fits" if need <= result.kv_budget else "does NOT fit"
    lines.append(f"max_num_seqs {config.max_num_seqs} x max_model_len {result.max_model_len} "
                 f"needs {need / 2**30:.2f} GiB of KV: {verdict}")
    if result.full_length_seqs == 0:
        lines.append("the engine refuses this: the KV budget holds less than one sequence of "
                     "max_model_len; raise --kv-cache-memory or lower --max-model-len")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def cmd_merge_lora(args) -> int:
    from pagedllm.lora.merge import merge_lora

    try:
        out = merge_lora(args.base, args.adapter, args.out_dir)
    except ValueError as e:
        sys.stderr.write(f"pagedllm merge-lora: error: {e}\n")
        return 2
    sys.stdout.write(f"merged checkpoint written to {out}\n")
    return 0


def cmd_finetune(args) -> int:
    from pagedllm.finetune.cli import run_finetune

    return run_finetune(args)


def _memory_bytes(text: str) -> int:
    """--memory: GiB for a plain number, else a size with a unit (80GiB, 24GB)."""
    from pagedllm.config import parse_size

    try:
        return int(float(text) * 2**30)
    except ValueError:
        return parse_size(text)


def cmd_build_kernels(args) -> int:
    """Compile the CPU kernels now, every family (a first start builds the ones its model
    needs)."""
    from pagedllm.kernels import cpu_ops

    for family in cpu_ops.FAMILIES:
        if cpu_ops.load(family) is None:
            sys.stderr.write(f"error: the CPU kernels ({family}) could not be built (see the "
                             "warning above); the engine would fall back to the slower torch "
                             "path\n")
            return 1
        sys.stdout.write(f"CPU kernels ({family}) ready in "
                         f"{cpu_ops.build_dir(cpu_ops.module_name(family))}\n")
    return 0


def cmd_bench(args) -> int:
    """Run one benchmark; without a name, list them (what `pagedllm bench` can run)."""
    from pagedllm.entrypoints.bench import BENCHMARKS, run_benchmark

    if args.benchmark is None:
        sys.stdout.write("pagedllm bench NAME [flags]: run benchmarks/NAME of this checkout "
                         "(`pagedllm bench NAME --help` for its flags)\n")
        for name, b in BENCHMARKS.items():
            sys.stdout.write(f"  {name:<11} {b.summary}\n")
        return 0
    return run_benchmark(args.benchmark, args.bench_args)


def build_parser() -> argparse.ArgumentParser:
    from pagedllm import __version__
    from pagedllm.entrypoints.bench import BENCHMARKS

    parser = argparse.ArgumentParser(prog="pagedllm", description=__doc__)
    parser.add_argument("--version", "-V", action="version", version=f"pagedllm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help,
                              formatter_class=_HelpFormatter)

    serve = command("serve", "OpenAI-compatible HTTP server and a chat page at /")
    add_engine_args(serve)
    add_server_args(serve)
    serve.set_defaults(func=cmd_serve)
    gen = command("generate", "generate completions for prompts, printed as plain text")
    add_engine_args(gen)
    gen.add_argument("--prompt", action="append", required=True, help="repeatable")
    gen.add_argument("--json", action="store_true",
                     help="one JSON object per prompt (prompt, text, token_ids, finish_reason)")
    _lora_arg(gen)
    _sampling_args(gen)
    gen.set_defaults(func=cmd_generate)
    chat = command("chat", "interactive chat with the model's chat template")
    add_engine_args(chat)
    chat.add_argument("--system", default=None, help="system prompt")
    _lora_arg(chat)
    _sampling_args(chat)
    chat.set_defaults(func=cmd_chat)
    pl = command("plan", "the engine's memory plan for a model and these flags, from its "
                 "config.json or .gguf metadata (no weights loaded)")
    add_engine_args(pl)
    pl.add_argument("--memory", default=None,
                    help="device memory to plan for: GiB, or a size with a unit (80GiB); "
                    "None = the engine's KV budget (--kv-cache-memory, else 2GiB on CPU)")
    pl.set_defaults(func=cmd_plan)
    ml = sub.add_parser("merge-lora", help="merge a PEFT LoRA adapter into an HF checkpoint")
    ml.add_argument("base", help="HF checkpoint directory (safetensors)")
    ml.add_argument("adapter", help="PEFT adapter directory (adapter_config.json + weights)")
    ml.add_argument("out_dir", help="where the merged checkpoint is written")
    ml.set_defaults(func=cmd_merge_lora)
    ft = command("finetune", "train a LoRA / QLoRA adapter (PEFT format, served by "
                 "--lora-modules unchanged)")
    from pagedllm.finetune.cli import add_finetune_args

    add_finetune_args(ft)
    ft.set_defaults(func=cmd_finetune)
    bk = command("build-kernels", "compile the C++ CPU kernels now (cached; a first start "
                 "otherwise does it)")
    bk.set_defaults(func=cmd_build_kernels)
    bench = command("bench", "benchmarks like `vllm bench`: " + ", ".join(
        f"{k} ({v.summary})" for k, v in BENCHMARKS.items()))
    bench.add_argument("benchmark", nargs="?", choices=list(BENCHMARKS),
                       help="which benchmark (none: list them)")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER,
                       help="the benchmark's own flags (pagedllm bench NAME --help)")
    bench.set_defaults(func=cmd_bench)
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
