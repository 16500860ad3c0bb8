"""llama.cpp as a peer: its own benchmark tools (output parsed from their Markdown tables),
`llama-server`, and the `llama-cpp-python` bindings.

Offline throughput comes from `llama-batched-bench`, whose table row for B parallel sequences
is

    |    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
    |   128 |    128 |    8 |   2048 |    6.790 |   150.81 |   11.204 |    91.40 |   17.994 |   113.82 |

(T_PP: prefill of all B prompts; T_TG: B x TG decode steps; S t/s = all tokens / T). pagedllm
and HF report output tokens / wall time including prefill, so the comparable llama.cpp number is
B x TG / T, recorded as `output_tok_s` next to the table's own columns.
"""

from __future__ import annotations

import logging
import re
import statistics
import subprocess
import time
from pathlib import Path

logger = logging.getLogger("benchmarks.peers")

_NUM = re.compile(r"^[-+]?\d+(\.\d+)?$")


def parse_md_table(text: str) -> list[dict[str, str]]:
    """Rows of the first Markdown table in `text` as {header: cell} (lines without '|' and
    the `|---|` rule are skipped; log lines around the table are ignored)."""
    header: list[str] | None = None
    rows: list[dict[str, str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not (line.startswith("|") and line.endswith("|")):
            if header is not None and rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
        elif all(set(c) <= set("-: ") for c in cells):
            continue
        elif len(cells) == len(header):
            rows.append(dict(zip(header, cells, strict=True)))
    return rows


def parse_batched_bench(text: str) -> list[dict[str, float]]:
    """`llama-batched-bench` table -> one dict per (PP, TG, B) with output_tok_s added."""
    keys = {"PP": "pp", "TG": "tg", "B": "batch", "N_KV": "n_kv", "T_PP s": "t_pp_s",
            "S_PP t/s": "prefill_tok_s", "T_TG s": "t_tg_s", "S_TG t/s": "decode_tok_s",
            "T s": "seconds", "S t/s": "total_tok_s"}
    out = []
    for row in parse_md_table(text):
        if not set(keys) <= set(row) or not all(_NUM.match(row[k]) for k in keys):
            continue
        rec = {name: float(row[k]) for k, name in keys.items()}
        for k in ("pp", "tg", "batch", "n_kv"):
            rec[k] = int(rec[k])
        rec["output_tokens"] = rec["batch"] * rec["tg"]
        rec["output_tok_s"] = rec["output_tokens"] / rec["seconds"]
        out.append(rec)
    if not out:
        raise ValueError("no llama-batched-bench result rows found in its output:\n" + text[-2000:])
    return out


def parse_llama_bench(text: str) -> list[dict]:
    """`llama-bench` table (| model | size | params | backend | threads | test | t/s |) ->
    [{"test": "pp512", "tok_s": 151.2, "stdev": 1.3, "threads": 2}, ...]."""
    out = []
    for row in parse_md_table(text):
        ts = row.get("t/s", "")
        m = re.match(r"^([\d.]+)\s*(?:±\s*([\d.]+))?$", ts)
        if not m or "test" not in row:
            continue
        rec = {"test": row["test"], "tok_s": float(m.group(1)),
               "stdev": float(m.group(2) or 0.0)}
        if row.get("threads", "").isdigit():
            rec["threads"] = int(row["threads"])
        out.append(rec)
    if not out:
        raise ValueError("no llama-bench result rows found in its output:\n" + text[-2000:])
    return out


def run_tool(cmd: list[str], timeout: float) -> str:
    """Run a llama.cpp tool; its output, or RuntimeError with the tail when it fails."""
    logger.info("$ %s", " ".join(map(str, cmd)))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} exited {proc.returncode}:\n"
                           f"{proc.stdout[-3000:]}")
    return proc.stdout


def batched_bench(binary: Path, model: Path, *, threads: int, npp: int, ntg: int,
                  npl: list[int], timeout: float = 3600.0) -> dict:
    ctx = max(npl) * (npp + ntg) + 64
    cmd = [str(binary), "-m", str(model), "-t", str(threads), "-tb", str(threads),
           "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(npp), "-ntg", str(ntg),
           "-npl", ",".join(map(str, npl))]
    rows = parse_batched_bench(run_tool(cmd, timeout))
    return {"command": " ".join(cmd), "rows": rows}


def llama_bench_prefill(binary: Path, model: Path, *, threads: int, n_prompt: int,
                        reps: int, timeout: float = 1800.0) -> dict:
    cmd = [str(binary), "-m", str(model), "-t", str(threads), "-p", str(n_prompt), "-n", "0",
           "-r", str(reps)]
    rows = parse_llama_bench(run_tool(cmd, timeout))
    row = next(r for r in rows if r["test"] == f"pp{n_prompt}")
    return {"command": " ".join(cmd), "prompt_tokens": n_prompt, "reps": reps,
            "seconds": n_prompt / row["tok_s"], "prefill_tok_s": row["tok_s"],
            "stdev": row["stdev"]}


def server_command(binary: Path, model: Path, *, threads: int, parallel: int, ctx_per_seq: int,
                   port: int) -> list[str]:
    """`llama-server --parallel N`: the context is split evenly between the N slots."""
    return [str(binary), "-m", str(model), "-t", str(threads), "-tb", str(threads),
            "--parallel", str(parallel), "-c", str(parallel * ctx_per_seq), "-b", "2048",
            "-ub", "512", "--host", "127.0.0.1", "--port", str(port), "--no-webui"]


# ------------------------------------------------------------------ llama-cpp-python
class Bindings:
    """`llama_cpp.Llama` on the same GGUF: one sequence at a time (its high-level API has no
    batched generation), so it contributes the concurrency-1 and prefill rows only."""

    def __init__(self, model: Path, *, threads: int, n_ctx: int) -> None:
        import llama_cpp

        self.version = llama_cpp.__version__
        self.llm = llama_cpp.Llama(str(model), n_ctx=n_ctx, n_batch=512, n_threads=threads,
                                   n_threads_batch=threads, verbose=False)

    def _greedy(self, prompt: list[int], n: int) -> int:
        self.llm.reset()
        count = 0
        # generate() never stops by itself (no EOS check): that is ignore_eos.
        for _ in self.llm.generate(prompt, top_k=1, temp=0.0, reset=True):
            count += 1
            if count == n:
                break
        return count

    def offline(self, prompts: list[list[int]], output_len: int) -> dict:
        self._greedy(prompts[0][:8], 2)
        t0 = time.perf_counter()
        n_out = sum(self._greedy(p, output_len) for p in prompts)
        dt = time.perf_counter() - t0
        return {"requests": len(prompts), "seconds": dt, "output_tokens": n_out,
                "output_tok_s": n_out / dt}

    def prefill(self, prompt: list[int], reps: int) -> dict:
        times = []
        for _ in range(reps):
            self.llm.reset()
            t0 = time.perf_counter()
            self.llm.eval(prompt)
            times.append(time.perf_counter() - t0)
        dt = statistics.median(times)
        return {"prompt_tokens": len(prompt), "seconds": dt, "prefill_tok_s": len(prompt) / dt}
