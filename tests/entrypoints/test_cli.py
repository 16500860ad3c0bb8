"""The command line: vLLM flag parity (each accepted with vLLM's meaning or refused naming
why), --help defaults, `python -m pagedllm`, `generate` output, `build-kernels`, `bench`, and
the generation_config.json sampling defaults."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys

import pytest

from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.entrypoints.args import engine_config_from_args
from pagedllm.entrypoints.cli import build_parser, main


def parse(*argv: str):
    return build_parser().parse_args(["serve", *argv])


@pytest.mark.parametrize(("text", "tokens"), [("4096", 4096), ("4k", 4000), ("4K", 4096),
                                              ("25.6k", 25600), ("1M", 2**20), ("2m", 2 * 10**6)])
def test_max_model_len_sizes(text, tokens):
    assert parse("--max-model-len", text).max_model_len == tokens
    assert parse("--max-num-batched-tokens", text).max_num_batched_tokens == tokens


@pytest.mark.parametrize("bad", ["4x", "1.5", "k"])
def test_max_model_len_bad_sizes_are_refused(bad, capsys):
    with pytest.raises(SystemExit):
        parse("--max-model-len", bad)
    assert "--max-model-len" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "nbytes"), [("2147483648", 2**31), ("4GiB", 4 * 2**30),
                                              ("512MiB", 2**29), ("1.5G", 1_500_000_000)])
def test_kv_cache_memory_units(text, nbytes):
    assert engine_config_from_args(parse("--kv-cache-memory", text)).kv_cache_memory == nbytes


@pytest.mark.parametrize(("text", "gib"), [("4", 4.0), ("0.5", 0.5), ("512MiB", 0.5),
                                           ("2GiB", 2.0), ("0", 0.0)])
def test_swap_space_units(text, gib):
    assert engine_config_from_args(parse("--swap-space", text)).swap_space == gib


def test_parallel_sizes(capsys):
    assert parse("-tp", "1").tensor_parallel_size == 1
    config = engine_config_from_args(parse("--tensor-parallel-size", "2", "-dp", "3",
                                           "--distributed-executor-backend", "ray"))
    assert (config.tensor_parallel_size, config.data_parallel_size) == (2, 3)
    assert config.distributed_executor_backend == "ray"
    assert config.enable_expert_parallel is None  # auto
    for flag, value in (("--enable-expert-parallel", True), ("--no-enable-expert-parallel", False)):
        assert engine_config_from_args(parse("-tp", "2", flag)).enable_expert_parallel is value
    with pytest.raises(SystemExit):
        parse("--tensor-parallel-size", "0")
    assert "not a process count" in capsys.readouterr().err


def test_trust_remote_code_is_explained_and_enforce_eager_reaches_the_config(caplog):
    caplog.set_level(logging.INFO)
    args = parse("--trust-remote-code", "--enforce-eager")
    assert engine_config_from_args(args).enforce_eager
    assert "no code from a model repository is ever run" in caplog.text
    assert not engine_config_from_args(parse()).enforce_eager


def test_server_flags():
    args = parse("--uvicorn-log-level", "warning", "--disable-log-requests",
                 "--generation-config", "vllm")
    assert args.uvicorn_log_level == "warning" and args.disable_log_requests
    assert engine_config_from_args(args).generation_config == "vllm"
    with pytest.raises(SystemExit):
        parse("--uvicorn-log-level", "loud")


def test_generation_config_must_be_auto_vllm_or_a_folder(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        engine_config_from_args(parse("--generation-config", str(tmp_path / "missing")))


@pytest.mark.parametrize("command", ["serve", "generate", "chat", "plan"])
def test_help_shows_every_default(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    for flag in ("--max-model-len", "--kv-cache-memory", "--swap-space", "--block-size",
                 "--dtype", "--generation-config", "--tensor-parallel-size"):
        line = out[out.index(flag):]
        assert "(default: " in line[:line.index("\n  -")], flag


def test_python_m_pagedllm():
    out = subprocess.run([sys.executable, "-m", "pagedllm", "--help"], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    assert "build-kernels" in out and "bench" in out and "serve" in out


def test_build_kernels(capsys):
    """Every kernel family is built (a first start builds only those its model needs)."""
    from pagedllm.kernels import cpu_ops

    assert main(["build-kernels"]) == 0
    out = capsys.readouterr().out
    for family in cpu_ops.FAMILIES:
        assert f"CPU kernels ({family}) ready in" in out, out


ENGINE = ["--kv-cache-memory", "4MiB", "--num-threads", "1"]


def test_generate_prints_plain_text_and_json(tiny_llama_dir, capsys, make_llm):
    from pagedllm import SamplingParams

    prompts = ["hello world", "the end"]
    argv = ["generate", str(tiny_llama_dir), *ENGINE, "--max-tokens", "6", "--prompt",
            prompts[0], "--prompt", prompts[1]]
    expected = [o.outputs[0] for o in make_llm(tiny_llama_dir).generate(
        prompts, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)]
    assert main(argv) == 0
    assert capsys.readouterr().out == f"{expected[0].text}\n\n{expected[1].text}\n"
    assert main([*argv, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in rows] == prompts
    assert [r["text"] for r in rows] == [c.text for c in expected]
    assert [r["token_ids"] for r in rows] == [list(c.token_ids) for c in expected]
    assert all(r["finish_reason"] == "length" for r in rows)


def test_generate_seed_is_serves_flag(tiny_llama_dir, capsys):
    argv = ["generate", str(tiny_llama_dir), *ENGINE, "--max-tokens", "8", "--temperature",
            "1.0", "--prompt", "hello", "--json"]
    texts = []
    for seed in ("1", "1", "2"):
        assert main([*argv, "--seed", seed]) == 0
        texts.append(json.loads(capsys.readouterr().out)["token_ids"])
    assert texts[0] == texts[1] != texts[2]


def test_bench_latency_runs_the_benchmark_script(tiny_llama_dir, tmp_path, capsys):
    out = tmp_path / "latency.json"
    assert main(["bench", "latency", "--model", str(tiny_llama_dir), "--batch-size", "2",
                 "--input-len", "4", "--output-len", "4", "--num-iters", "2",
                 "--num-iters-warmup", "0", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert len(res["latencies_s"]) == 2 and res["mean_s"] > 0
    assert "mean s" in capsys.readouterr().out


def test_bench_help_lists_the_benchmarks(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in ("throughput", "serve", "latency", "startup"))


@pytest.fixture
def model_with_generation_config(tiny_llama_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_llama_dir, model)
    (model / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 1, "do_sample": True, "temperature": 0.6,
         "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}))
    return model


def test_generation_config_auto_and_vllm(model_with_generation_config):
    from pagedllm.engine.async_engine import AsyncEngine
    from pagedllm.entrypoints.protocol import CompletionRequest
    from pagedllm.entrypoints.serving import ServingBase

    def engine(mode: str) -> LLMEngine:
        return LLMEngine(engine_config_from_args(parse(str(model_with_generation_config),
                                                       *ENGINE, "--generation-config", mode)))

    auto = engine("auto")
    assert auto.sampling_defaults == {"temperature": 0.6, "top_p": 0.9, "top_k": 20,
                                      "repetition_penalty": 1.1}
    serving = ServingBase(AsyncEngine(auto), ["m"])
    p = serving.sampling_params(CompletionRequest(prompt="x"), 4, None)
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty) == (0.6, 0.9, 20, 1.1)
    own = serving.sampling_params(CompletionRequest(prompt="x", temperature=0.2, top_k=0), 4,
                                  None)
    assert (own.temperature, own.top_k, own.top_p) == (0.2, 0, 0.9)  # the request's win
    plain = ServingBase(AsyncEngine(engine("vllm")), ["m"])
    q = plain.sampling_params(CompletionRequest(prompt="x"), 4, None)
    assert (q.temperature, q.top_p, q.top_k, q.repetition_penalty) == (1.0, 1.0, 0, 1.0)


def test_help_never_shows_the_api_key_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("PAGEDLLM_API_KEY", "s3cret-key")
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--api-key" in out and "s3cret-key" not in out
