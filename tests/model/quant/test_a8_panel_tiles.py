"""The int8-activation panels on matrix tiles (kernels/a8_panel_tiles_cpu.h): whole 16-row tiles
of a call on AMX-int8 (TDPBSUD), the rest on VNNI, the same bits out as VNNI alone, for every
panel format, partial panels, odd block counts, rows around the tile size, and MoE experts.

The tiles run three ways: `amx` (the instructions, on a CPU with AMX-int8; skipped elsewhere
with the reason; the default there, for calls of 32 rows or more), `emulated` (a software model
of the tiles, the same kernel code around it: tests the tile layouts and the epilogue on any
AVX-512 VNNI build) and `off` (VNNI only; the default elsewhere)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest
import torch

from pagedllm.kernels import cpu_features, cpu_ops
from pagedllm.model.layers.quant.gguf_a8_panels import PANEL_TYPES, GGUFA8PanelWeight
from tests.model.quant.test_gguf_formats import random_blocks, whole_k


@contextlib.contextmanager
def chosen(get, choose, mode: str, why_not: str | None):
    """Tiles `mode` chosen with `choose` for the block, or the test skipped with `why_not`
    (this CPU or build cannot run them); the choice before (`get`) restored after. An AMX CPU
    whose native build cannot run its tiles fails in `choose`."""
    before = get()
    try:
        if why_not is not None:
            pytest.skip(why_not)
        choose(mode)
        yield
    finally:
        choose(before)


def _int8_why_not(mode: str) -> str | None:
    if mode == "amx" and "amx_int8" not in cpu_features.cpu_flags():
        return "this CPU has no AMX-int8 (amx_int8 not in /proc/cpuinfo)"
    if mode == "emulated" and cpu_features.int8_dot_isa() != "avx512_vnni":
        return ("the tile kernels are built with AVX-512 VNNI only (this build: "
                f"{cpu_features.int8_dot_isa()})")
    if mode == "amx" and cpu_ops._march() != "native":
        return f"PAGEDLLM_CPU_MARCH={cpu_ops._march()}: a build without AMX"
    return None


def tiles(ops, mode: str):
    return chosen(ops.int8_tiles, ops.set_int8_tiles, mode, _int8_why_not(mode))


@pytest.mark.parametrize("mode", ["emulated", "amx"])
@pytest.mark.parametrize("qtype", PANEL_TYPES)
@pytest.mark.parametrize("n,k", [(70, 256), (33, 96), (512, 160), (16, 64)])
def test_tiles_equal_vnni_bit_for_bit(ops, mode, qtype, n, k):
    """Partial panels (n = 70, 33: d = 0 past N, the second column half absent at 16), odd
    block counts (K / 32 = 3, 5), rows 16 and 17 (below the 32 rows from which a call takes
    the tiles: all VNNI), 32 (two 16-row tiles), 33 and 35 (tiles + VNNI rows), 48, 64."""
    k = whole_k(qtype, k)  # Q4_K: whole 256-value super-blocks
    raw = random_blocks(qtype, n, k, seed=n + k)
    w = GGUFA8PanelWeight.from_blocks(qtype, raw, (n, k))
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(k)) * 3
    x[1, : k // 2] = 0  # all-zero blocks (scale 0) inside a tile
    with tiles(ops, "off"):
        want = {m: w.linear(x[:m].contiguous()) for m in (16, 17, 32, 33, 35, 48, 64)}
    with tiles(ops, mode):
        assert ops.int8_tiles() == mode
        for m, y in want.items():
            got = w.linear(x[:m].contiguous())
            assert torch.equal(got, y), f"M={m}: max diff {(got - y).abs().max():.3g}"


@pytest.mark.parametrize("mode", ["emulated", "amx"])
@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_moe_experts_on_tiles_equal_vnni(ops, mode, qtype):
    """The grouped kernel's items (an expert's rows, up to 256 a tile) go through the same
    panel code: tiles where the expert has 32 rows or more, as one call of its rows would."""
    from tests.model.test_moe_grouped import CASES, quantized_experts

    experts = quantized_experts(qtype, int8_activations=True)
    x, weights, ids = CASES["prefill 300 tokens"]
    x = x * 0.01
    with tiles(ops, "off"):
        want = experts(x, weights, ids)
    with tiles(ops, mode):
        got = experts(x, weights, ids)
    assert torch.equal(got, want), f"max diff {(got - want).abs().max():.3g}"


def test_choices_and_errors(ops):
    with tiles(ops, "off"):  # restores the choice in force before
        assert ops.set_int8_tiles("off") == "off"
        with pytest.raises(ValueError, match="auto, amx, emulated or off"):
            ops.set_int8_tiles("tiles")
        try:
            runs_amx = ops.set_int8_tiles("amx") == "amx"
        except ValueError:
            runs_amx = False
        # auto: AMX wherever this build, the CPU and the OS run it (1.10-1.25x VNNI at 64
        # rows on a Sapphire Rapids class Xeon), else VNNI alone
        assert ops.set_int8_tiles("auto") == ("amx" if runs_amx else "off")
        if "amx_int8" not in cpu_features.cpu_flags():
            with pytest.raises(ValueError, match="built without AMX-int8"):
                ops.set_int8_tiles("amx")


@pytest.mark.parametrize("variable,getter,choices", [
    ("PAGEDLLM_INT8_TILES", "int8_tiles", "auto, amx, emulated, off"),
    ("PAGEDLLM_PROMPT_TILES", "prompt_tiles", "auto, amx, vector, emulated, off")])
def test_environment_choice_is_applied_and_checked_at_load(variable, getter, choices):
    """PAGEDLLM_INT8_TILES (the int8 panels' tiles) and PAGEDLLM_PROMPT_TILES (the prompt
    rows' bf16 tiles, test_prompt_tiles.py) reach the kernels when they load; a value that is
    no choice (or tiles this machine cannot run) is one clear error, not a silent fallback."""
    code = ("from pagedllm.kernels import cpu_ops\n"
            f"print(cpu_ops.load().{getter}())\n")
    env = {**os.environ, variable: "off"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip() == "off", out.stderr[-2000:]
    env[variable] = "matrix"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode != 0
    assert f"{variable} must be one of {choices}, got 'matrix'" in out.stderr


@pytest.mark.parametrize("mode", ["emulated", "amx"])
@pytest.mark.parametrize("qtype", PANEL_TYPES)
def test_mlp_in_one_call_on_tiles_equals_vnni(ops, mode, qtype):
    """`a8_panel_mlp` runs its gate / up rows through the same panel code (16-row tiles into
    its per-thread buffers, row chunks of 64): the bits of the VNNI path, 17-300 rows."""
    hidden, inter = whole_k(qtype, 96), whole_k(qtype, 128)
    gate_up = GGUFA8PanelWeight.from_blocks(
        qtype, random_blocks(qtype, 2 * inter, hidden, seed=3), (2 * inter, hidden))
    down = GGUFA8PanelWeight.from_blocks(
        qtype, random_blocks(qtype, hidden, inter, seed=4), (hidden, inter))
    x = torch.randn(300, hidden, generator=torch.Generator().manual_seed(5)) * 0.2
    with tiles(ops, "off"):
        want = {m: gate_up.gated_mlp(down, x[:m].contiguous()) for m in (17, 48, 100, 300)}
    with tiles(ops, mode):
        for m, y in want.items():
            assert torch.equal(gate_up.gated_mlp(down, x[:m].contiguous()), y), m
