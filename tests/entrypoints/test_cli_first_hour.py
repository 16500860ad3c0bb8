"""What a vLLM user types in the first hour (issue 29): `--version`, a fast `--help` that
states each default once, `bench` without a name, `plan` naming its model, incompatible
flags refused before anything loads, and the int8-of-GGUF warning with its numbers."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pagedllm.config import engine as engine_config
from pagedllm.config import vocabulary
from pagedllm.entrypoints import args as cli_args
from pagedllm.entrypoints.cli import main
from pagedllm.model.layers.quant import hf_checkpoint

COMMANDS = ("serve", "generate", "chat", "plan", "finetune", "bench", "build-kernels")


def _run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pagedllm", *argv], capture_output=True,
                          text=True, timeout=timeout)


def test_version_prints_the_installed_version_and_exits_0():
    out = _run("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"pagedllm {importlib.metadata.version('pagedllm')}"


def test_help_is_fast_and_imports_no_torch():
    """`serve --help` in a fresh interpreter: < 2 s on a loaded 2-core machine, because the
    parser is built without importing torch (which alone takes seconds)."""
    t0 = time.perf_counter()
    out = _run("serve", "--help")
    elapsed = time.perf_counter() - t0
    assert out.returncode == 0, out.stderr
    assert "--tensor-parallel-size" in out.stdout
    assert elapsed < 2.0, f"serve --help took {elapsed:.2f} s"
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from pagedllm.entrypoints.cli import build_parser; "
         "build_parser(); print(sorted(m for m in ('torch', 'transformers') if m in "
         "sys.modules))"], capture_output=True, text=True, timeout=60, check=True)
    assert probe.stdout.strip() == "[]"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_states_each_default_once(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for help_text in re.split(r" -{1,2}[a-z]", text):  # one flag's help at a time
        assert help_text.count("(default") <= 1, help_text


def test_flag_vocabularies_are_the_engines():
    """One torch-free list (config/vocabulary.py) feeds the parser's choices and EngineConfig's
    checks; every HF quantization format with a registered method is a --quantization choice."""
    parser = argparse.ArgumentParser()
    cli_args.add_engine_args(parser)
    choices = {a.dest: a.choices for a in parser._actions if a.choices}
    assert tuple(choices["quantization"]) == vocabulary.QUANTIZATION_METHODS
    assert set(choices["kv_cache_dtype"]) == {"auto", *engine_config.KV_CACHE_DTYPES}
    assert tuple(choices["preemption_mode"]) == engine_config.PREEMPTION_MODES
    assert set(hf_checkpoint.SUPPORTED_METHODS) <= set(vocabulary.QUANTIZATION_METHODS)
    assert all(isinstance(v, torch.dtype) for v in engine_config.KV_CACHE_DTYPES.values())


def test_bench_without_a_name_lists_the_benchmarks():
    out = _run("bench")
    assert out.returncode == 0, out.stderr
    for name in ("throughput", "serve", "latency", "startup"):
        assert re.search(rf"^\s+{name}\s+\S", out.stdout, re.M), out.stdout


def test_plan_names_the_model(tiny_llama_dir, capsys):
    assert main(["plan", str(tiny_llama_dir)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("model:") and str(tiny_llama_dir) in first
    assert "LlamaForCausalLM" in first


def _quantized_hf_dir(tmp_path: Path) -> Path:
    d = tmp_path / "awq-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"],
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}))
    return d


@pytest.mark.parametrize("kind", ["awq", "int8"])
def test_tensor_parallel_with_quantized_weights_is_refused_before_loading(
        kind, tmp_path, monkeypatch, capsys):
    """Nothing may be loaded: the checkpoint loader, the kernel build and the socket bind all
    raise if reached, and the refusal comes in well under a second."""
    import pagedllm.entrypoints.api_server as api_server
    import pagedllm.worker.rank_builder as rank_builder
    from pagedllm.kernels import cpu_ops

    def reached(*_a, **_k):
        raise AssertionError("loaded something before refusing")

    monkeypatch.setattr(rank_builder, "load_checkpoint", reached)
    monkeypatch.setattr(cpu_ops, "load", reached)
    monkeypatch.setattr(api_server, "bind_socket", reached)
    model = _quantized_hf_dir(tmp_path)
    extra = ["--quantization", "int8"] if kind == "int8" else []
    if kind == "int8":  # --quantization int8 of a float checkpoint
        (model / "config.json").write_text(json.dumps(
            {k: v for k, v in json.loads((model / "config.json").read_text()).items()
             if k != "quantization_config"}))
    t0 = time.perf_counter()
    code = main(["serve", str(model), "--tensor-parallel-size", "2", *extra])
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    assert code == 1
    assert f"quantized weights ({kind})" in err and "--quantization none" in err, err
    assert "loaded something" not in err
    assert elapsed < 0.5, f"refusal took {elapsed:.2f} s"


def test_tensor_parallel_with_dequantized_weights_passes_the_early_check(tmp_path):
    from pagedllm.distributed.executor import check_tensor_parallel, weight_format_before_loading
    from pagedllm.entrypoints.cli import build_parser

    model = _quantized_hf_dir(tmp_path)
    args = build_parser().parse_args(["serve", str(model), "-tp", "2", "--quantization", "none"])
    config = cli_args.engine_config_from_args(args)
    assert weight_format_before_loading(config) == "none"
    check_tensor_parallel(config, "none")  # no error


def test_int8_of_a_quantized_gguf_warns_with_the_numbers(caplog):
    from pagedllm.loader import ModelNotFoundError, default_model_path
    from pagedllm.loader.gguf_loader import warn_int8_of_quantized

    try:
        path = default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    with caplog.at_level(logging.WARNING, logger="pagedllm.loader.gguf_loader"):
        warn_int8_of_quantized(path)
    text = caplog.text
    assert "--quantization int8" in text and "Q4_1" in text, text
    file_mib, int8_mib = map(int, re.findall(r"(\d+) MiB", text)[:2])
    assert 80 <= file_mib <= 100 and int8_mib > file_mib
