"""The prompt rows' attention on AMX-bf16 tiles (kernels/varlen_tiles_cpu.h): while a step's
prompt rows run on the tiles (model/layers/quant/prompt_rows.py) the CPU backend sends their
attention there too. It stays close to torch SDPA for mixed lengths, GQA, head sizes 32..256,
sliding windows, soft-capping and 8-bit caches; a row's bits do not depend on how its prompt
was chunked or what else is in the step; rows past a prompt's end (and every row outside a
prompt scope) keep the fp32 kernel's bits; a one-token prompt chunk among the decodes runs on
the tiles too.

`emulated` runs the software model of the tiles (any AVX-512 BW build); `amx` TDPBF16PS on a
CPU with AMX-bf16, `vector` VDPBF16PS on a CPU with AVX-512 BF16 (each skipped elsewhere with
the reason)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedllm.model.layers.quant import prompt_rows
from pagedllm.model.layers.quant.prompt_rows import PromptRows
from tests.model.quant.test_prompt_tiles import MODES, prompt_tiles
from tests.model.test_varlen_attention import _backend, _run, chunked_rows

BF16 = {"atol": 3e-2, "rtol": 3e-2}  # q, k, v and the probabilities rounded to bf16


def _on_tiles(step: PromptRows | None, **kwargs):
    """`_run` (test_varlen_attention.py) with `step` (default: every row a prompt row) in
    scope, as the runner scopes a step."""
    rows = kwargs.get("decodes", 0) + sum(kwargs["new"])
    with prompt_rows.step_scope(step or PromptRows(rows)):
        return _run(_backend("kernel"), **kwargs)


CASES = {
    "mixed": {"ctx": [0, 0, 0, 40, 7, 100, 16], "new": [1, 5, 300, 17, 2, 64, 333],
              "decodes": 2, "h": 9, "kvh": 3},
    "d128": {"ctx": [0, 30, 3], "new": [77, 19, 40], "h": 8, "kvh": 2, "d": 128},
    "d256": {"ctx": [0, 30, 3], "new": [77, 19, 40], "h": 4, "kvh": 1, "d": 256,
             "block_size": 32},
    "d32": {"ctx": [0, 30, 3], "new": [77, 19, 40], "h": 4, "kvh": 4, "d": 32,
            "block_size": 8},
    "window7": {"ctx": [0, 50, 0], "new": [200, 31, 9], "window": 7, "decodes": 1},
    "window100": {"ctx": [0, 50, 0], "new": [300, 31, 9], "window": 100, "decodes": 1},
    "softcap": {"ctx": [0, 20], "new": [50, 13], "softcap": 2.0, "window": 32},
    "int8": {"ctx": [0, 33, 0], "new": [70, 12, 1], "dtype": torch.int8, "decodes": 1},
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_close_to_reference_and_on_the_tiles(ops, mode, case):
    """Every row a prompt row: within bf16's rounding of SDPA, and not the fp32 kernel's
    bits (the rows did run on the tiles)."""
    with prompt_tiles(ops, mode):
        out, ref = _on_tiles(None, **CASES[case])
    fp32, _ = _run(_backend("kernel"), **CASES[case])
    torch.testing.assert_close(out, ref, **BF16)
    assert not torch.equal(out, fp32)


def test_head_size_off_the_tiles_keeps_fp32(ops):
    """A head size that is not a multiple of 32 runs the fp32 kernel, prompt rows or not."""
    case = {"ctx": [0, 30], "new": [77, 19], "h": 12, "kvh": 4, "d": 16}
    with prompt_tiles(ops, "emulated"):
        out, _ = _on_tiles(None, **case)
    assert torch.equal(out, _run(_backend("kernel"), **case)[0])


@pytest.mark.parametrize("mode", MODES)
def test_only_prompt_positions_take_the_tiles(ops, mode):
    """Two decodes (one of them a one-token prompt chunk) and three chunks: one all prompt,
    one crossing its prompt's end (a recompute after preemption), one past it. The rows past
    a prompt's end have the fp32 kernel's bits; the prompt rows do not."""
    new = [1, 1, 50, 30, 12]
    kwargs = {"ctx": [0, 40, 60], "new": new[2:], "decodes": 2, "h": 9, "kvh": 3}
    # _run's decodes are positions 5 and 8: the first past its 5-token prompt, the second
    # position 8 of a 10-token prompt (its last chunk of one token)
    step = PromptRows.build(np.array(new), np.array([5, 8, 0, 40, 60]),
                            np.array([5, 10, 50, 55, 60]))
    with prompt_tiles(ops, mode):
        out, ref = _on_tiles(step, **kwargs)
    fp32, _ = _run(_backend("kernel"), **kwargs)
    prompt = torch.zeros(sum(new), dtype=torch.bool)
    prompt[step.rows] = True
    assert prompt.tolist() == [False, True] + [True] * 50 + [True] * 15 + [False] * 15 + \
        [False] * 12
    assert torch.equal(out[~prompt], fp32[~prompt])
    diff = (out[prompt] != fp32[prompt]).flatten(1).any(1)
    assert diff.all()
    torch.testing.assert_close(out, ref, **BF16)


@pytest.mark.parametrize("mode", MODES)
def test_prompt_rows_do_not_depend_on_chunking_or_neighbours(ops, mode):
    """A prompt row's bits are the same whether its prompt runs in one chunk, or in two split
    off the tiles' 128-key grid with another sequence in front (batch invariance)."""
    with prompt_tiles(ops, mode):
        one, two = chunked_rows(lambda rows: prompt_rows.step_scope(PromptRows(rows)))
    assert torch.equal(one, two)


@pytest.mark.parametrize("mode", ["amx", "vector"])
def test_hardware_equals_the_software_model_closely(ops, mode):
    """The hardware's sums may round differently from the model's by an ulp; a probability
    rounded to bf16 can then move by one bf16 step (2^-8 of it)."""
    case = CASES["mixed"]
    with prompt_tiles(ops, "emulated"):
        model, _ = _on_tiles(None, **case)
    with prompt_tiles(ops, mode):
        hw, _ = _on_tiles(None, **case)
    torch.testing.assert_close(hw, model, rtol=1e-3, atol=1e-3)


def test_prompt_rows_need_tiles(ops):
    """The kernel refuses prompt rows when no prompt tiles are chosen (one clear error)."""
    with prompt_tiles(ops, "off"), pytest.raises(RuntimeError, match="no prompt tiles chosen"):
        _on_tiles(None, ctx=[0], new=[20])
