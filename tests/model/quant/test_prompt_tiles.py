"""A step's prompt rows on bf16 tiles over the GGUF panels (kernels/prompt_tiles_cpu.cpp,
model/layers/quant/prompt_rows.py): the kernel equals bf16(x) @ bf16(W)^T summed in fp32 for
every panel format, partial panels and row counts around the tile sizes; a row's result does
not depend on the other rows of its call; through the engine a prompt's tokens and logprobs
do not depend on chunking, prefix caching or batching, and only prompt positions take the
tiles.

The tiles run three ways here: `emulated` (the software model of AMX's tiles, the same kernel
code around it: any AVX-512 BW build), `amx` (TDPBF16PS, on a CPU with AMX-bf16) and `vector`
(VDPBF16PS, on a CPU with AVX-512 BF16), each skipped with the reason where the CPU lacks it.
The default (auto) is amx wherever it runs, else vector, else off (cpu_features.py); under
vector the engine sends only the prompt rows' attention to the tiles, their matrices stay on
the int8 panels."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from pagedllm import SamplingParams
from pagedllm.errors import InvalidInputError
from pagedllm.kernels import cpu_features, cpu_ops
from pagedllm.model.layers.linear import Linear
from pagedllm.model.layers.quant import prompt_tile_weights
from pagedllm.model.layers.quant.gguf_a8_panels import PANEL_TYPES, GGUFA8PanelWeight
from pagedllm.model.layers.quant.prompt_rows import PromptRows
from tests.conftest import make_tiny_checkpoint
from tests.loader.gguf_writer import write_gguf
from tests.model.quant.test_a8_panel_tiles import chosen
from tests.model.quant.test_gguf_formats import random_blocks, whole_k
from tests.model.quant.test_int8_engine import check_logprobs_close


def _why_not(mode: str) -> str | None:
    flags = cpu_features.cpu_flags()
    if mode == "off":
        return None
    if "avx512bw" not in flags:
        return "the prompt tile kernel needs an AVX-512 BW build (this CPU has no avx512bw)"
    if cpu_ops._march() != "native":
        return f"PAGEDLLM_CPU_MARCH={cpu_ops._march()}: not this CPU's build"
    if mode == "amx" and "amx_bf16" not in flags:
        return "this CPU has no AMX-bf16 (amx_bf16 not in /proc/cpuinfo)"
    if mode == "vector" and "avx512_bf16" not in flags:
        return "this CPU has no AVX-512 BF16 (avx512_bf16 not in /proc/cpuinfo)"
    return None


MODES = ["emulated", "amx", "vector"]


def prompt_tiles(ops, mode: str):
    return chosen(ops.prompt_tiles, ops.set_prompt_tiles, mode, _why_not(mode))


def bf16_linear(ops, x: torch.Tensor, w: GGUFA8PanelWeight) -> torch.Tensor:
    """a8_panel_bf16_linear over w (its kept bf16 tiles when it keeps them)."""
    return ops.a8_panel_bf16_linear(x, w.code, w.codes, w.d, w.m, w.out_features, w.tiles)


def bf16_mlp(ops, x: torch.Tensor, gu: GGUFA8PanelWeight, down: GGUFA8PanelWeight,
             inter: int | None = None) -> torch.Tensor:
    """a8_panel_bf16_mlp over fused [gate | up] gu and down."""
    return ops.a8_panel_bf16_mlp(x, gu.code, gu.codes, gu.d, gu.m, down.code, down.codes,
                                 down.d, down.m, inter or down.in_features, down.out_features,
                                 gu.tiles, down.tiles)


def _bf16_reference(x: torch.Tensor, w: GGUFA8PanelWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16(x) @ bf16(W)^T in float64, and the scale of its terms (sum |x| |w|) per entry."""
    wb = w.dequantize().to(torch.bfloat16).double()
    xb = x.to(torch.bfloat16).double()
    return xb @ wb.T, xb.abs() @ wb.abs().T


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("qtype", PANEL_TYPES)
@pytest.mark.parametrize("n,k", [(70, 256), (33, 96), (64, 64), (32, 1536)])
def test_kernel_equals_bf16_product(ops, mode, qtype, n, k):
    """Partial panels (70, 33: the last panel's columns past N never written), K of 2 to 48
    blocks; rows 1, 16 (one tile), 17, 37 (a 32-row pass and a 16-row one), 64, 416 (past
    one chunk of rows at K = 1,536). The sums are fp32 over exact bf16 products: within 1e-6
    of the fp64 product of the rounded operands (the bf16 rounding itself moves results by
    ~1e-3 of that scale). With the matrix's bf16 tiles kept, the same bits."""
    k = whole_k(qtype, k)  # Q4_K: whole 256-value super-blocks
    raw = random_blocks(qtype, n, k, seed=n + k)
    w = GGUFA8PanelWeight.from_blocks(qtype, raw, (n, k))
    kept = GGUFA8PanelWeight.from_blocks(qtype, raw, (n, k))
    x = torch.randn(416, k, generator=torch.Generator().manual_seed(k)) * 3
    x[1, : k // 2] = 0
    with prompt_tiles(ops, mode):
        assert kept.keep_bf16_tiles() == 2 * -(-n // 32) * 32 * k == kept.tiles.numel() * 2
        for m in (1, 16, 17, 37, 64, 416):
            got = bf16_linear(ops, x[:m].contiguous(), w)
            assert torch.equal(bf16_linear(ops, x[:m].contiguous(), kept), got)
            want, scale = _bf16_reference(x[:m], w)
            assert got.shape == (m, n) and got.is_contiguous()
            err = ((got.double() - want).abs() / scale.clamp_min(1e-30)).max().item()
            assert err < 1e-6, f"M={m}: relative error {err:.3g}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_rows_do_not_depend_on_the_call(ops, mode, qtype):
    """A row alone, in a 16-row tile or in the second tile of a 32-row pass: the same bits."""
    qt = gguf.GGMLQuantizationType[qtype]
    raw = random_blocks(qt, 96, 128, seed=3)
    w = GGUFA8PanelWeight.from_blocks(qt, raw, (96, 128))
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(4))
    with prompt_tiles(ops, mode):
        whole = bf16_linear(ops, x, w)
        for r in (0, 15, 17, 39):
            alone = bf16_linear(ops, x[r:r + 1].contiguous(), w)
            assert torch.equal(alone[0], whole[r]), f"row {r}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("gu_type, down_type", [("Q4_1", "Q4_1"), ("Q8_0", "Q4_0")])
def test_mlp_is_the_three_calls(ops, mode, gu_type, down_type):
    """a8_panel_bf16_mlp gives the bits of bf16 linear, silu_mul, bf16 linear, for row
    counts inside a tile, at a tile, past one and past a chunk of rows; N past a whole
    panel; with the bf16 tiles kept or not."""
    gt, dt = (gguf.GGMLQuantizationType[t] for t in (gu_type, down_type))
    inter, k, n = 96, 128, 70
    gu = GGUFA8PanelWeight.from_blocks(gt, random_blocks(gt, 2 * inter, k, seed=7),
                                       (2 * inter, k))
    down = GGUFA8PanelWeight.from_blocks(dt, random_blocks(dt, n, inter, seed=8), (n, inter))
    x = torch.randn(3100, k, generator=torch.Generator().manual_seed(9))
    with prompt_tiles(ops, mode):
        for m in (1, 16, 37, 3100):
            xm = x[:m].contiguous()
            h = ops.silu_mul(bf16_linear(ops, xm, gu).contiguous())
            want = bf16_linear(ops, h, down)
            got = bf16_mlp(ops, xm, gu, down)
            assert got.shape == (m, n) and torch.equal(got, want), f"M={m}"
            gu.keep_bf16_tiles()
            down.keep_bf16_tiles()
            assert torch.equal(bf16_mlp(ops, xm, gu, down), want), f"M={m}, tiles kept"
            gu.tiles = down.tiles = torch.empty(0, dtype=torch.int16)
        with pytest.raises(RuntimeError, match="not whole 32-value blocks"):
            bf16_mlp(ops, x, gu, down, inter=40)


@pytest.mark.parametrize("mode", MODES)
def test_q6_k_down_in_the_mlp(ops, mode):
    """A Q4_K_M file's MLP: Q4_K gate / up, Q6_K down (a scale every 16 values) on the prompt
    tiles, the bits of the three calls."""
    q6, q4 = gguf.GGMLQuantizationType.Q6_K, gguf.GGMLQuantizationType.Q4_K
    down = GGUFA8PanelWeight.from_blocks(q6, random_blocks(q6, 40, 256, seed=2), (40, 256))
    gu = GGUFA8PanelWeight.from_blocks(q4, random_blocks(q4, 512, 256, seed=3), (512, 256))
    x = torch.randn(37, 256, generator=torch.Generator().manual_seed(5))
    with prompt_tiles(ops, mode):
        want = bf16_linear(ops, ops.silu_mul(bf16_linear(ops, x, gu).contiguous()), down)
        assert torch.equal(bf16_mlp(ops, x, gu, down), want)


@pytest.mark.parametrize("mode", ["amx", "vector"])
def test_hardware_equals_the_software_model_closely(ops, mode):
    """Where the CPU has the instructions (TDPBF16PS, VDPBF16PS) against the model (the
    hardware may flush denormals and sum a pair at once: close, not necessarily equal)."""
    raw = random_blocks(gguf.GGMLQuantizationType.Q4_1, 96, 576, seed=5)
    w = GGUFA8PanelWeight.from_blocks(gguf.GGMLQuantizationType.Q4_1, raw, (96, 576))
    x = torch.randn(50, 576, generator=torch.Generator().manual_seed(6))
    with prompt_tiles(ops, "emulated"):
        model = bf16_linear(ops, x, w)
    with prompt_tiles(ops, mode):
        hw = bf16_linear(ops, x, w)
    torch.testing.assert_close(hw, model, rtol=1e-5, atol=1e-4)


def test_choices_and_errors(ops):
    with prompt_tiles(ops, "off"):
        assert ops.set_prompt_tiles("off") == "off"
        with pytest.raises(ValueError, match="auto, amx, emulated, vector or off"):
            ops.set_prompt_tiles("tiles")
        runs = {}
        for mode in ("amx", "vector"):  # can this build, CPU and OS run them?
            try:
                runs[mode] = ops.set_prompt_tiles(mode) == mode
            except ValueError:
                runs[mode] = False
        # auto: the tiles wherever they run (measured faster than the int8 panels on AMX; on
        # vectors for the attention, faster than the fp32 kernel on a Zen 4 class VM)
        assert ops.set_prompt_tiles("auto") == next((m for m in runs if runs[m]), "off")
        ops.set_prompt_tiles("off")
        if "amx_bf16" not in cpu_features.cpu_flags():
            with pytest.raises(ValueError, match="built without AMX-bf16"):
                ops.set_prompt_tiles("amx")
        if "avx512_bf16" not in cpu_features.cpu_flags():
            with pytest.raises(ValueError, match="built without AVX-512 BF16"):
                ops.set_prompt_tiles("vector")
        raw = random_blocks(gguf.GGMLQuantizationType.Q8_0, 32, 64, seed=1)
        w = GGUFA8PanelWeight.from_blocks(gguf.GGMLQuantizationType.Q8_0, raw, (32, 64))
        with pytest.raises(RuntimeError, match="no prompt tiles chosen"):
            bf16_linear(ops, torch.ones(2, 64), w)
        with pytest.raises(RuntimeError, match="x must be contiguous fp32"):
            bf16_linear(ops, torch.ones(2, 64).double(), w)
        w.tiles = torch.zeros(10, dtype=torch.int16)
        with prompt_tiles(ops, "emulated"), pytest.raises(RuntimeError, match="tiles must be"):
            bf16_linear(ops, torch.ones(2, 64), w)


def test_prompt_rows_of_a_step():
    """Decodes first (positions past their prompts), then prefill chunks: a whole prompt, a
    chunk crossing its prompt's end (a recompute after preemption), a one-token prompt
    chunk that the runner counts with the decodes."""
    q_lens = np.array([1, 1, 4, 3, 2])
    starts = np.array([9, 0, 0, 5, 6])
    prompt_lens = np.array([5, 1, 4, 6, 3])
    rows = PromptRows.build(q_lens, starts, prompt_lens)
    assert rows.total == 11
    assert rows.rows.tolist() == [1, 2, 3, 4, 5, 6]
    assert rows.rest.tolist() == [0, 7, 8, 9, 10]
    assert PromptRows.build(q_lens[:1], starts[:1], prompt_lens[:1]) is None
    every = PromptRows.build(np.array([4, 3]), np.array([0, 2]), np.array([4, 9]))
    assert every.total == 7 and every.rows is None
    x = torch.arange(11.0)[:, None].repeat(1, 3)
    y = rows.apply(x, lambda r: r * 10, lambda r: -r)
    assert y[:, 0].tolist() == [0, 10, 20, 30, 40, 50, 60, -7, -8, -9, -10]
    assert rows.span is None  # decodes on both sides: gathers


@pytest.mark.parametrize("q_lens, starts, prompt_lens, span, signs", [
    ([1, 1, 4, 3], [9, 7, 0, 2], [5, 3, 4, 9], (2, 9), "--+++++++"),  # decodes, then chunks
    ([4, 3], [0, 5], [4, 6], (0, 5), "+++++--"),  # a chunk crossing its prompt's end last
])
def test_prompt_rows_in_one_run_split_by_slices(q_lens, starts, prompt_lens, span, signs):
    """Prompt rows in one run at an end of the step: `apply` slices (no gather / scatter) and
    puts every row where the gathering path puts it."""
    rows = PromptRows.build(np.array(q_lens), np.array(starts), np.array(prompt_lens))
    assert rows.span == span
    x = torch.arange(float(rows.total))[:, None].repeat(1, 3)
    want = [i * 10 if s == "+" else -i for i, s in enumerate(signs)]
    assert rows.apply(x, lambda r: r * 10, lambda r: -r)[:, 0].tolist() == want
    gathered = PromptRows(rows.total, rows.rows, rows.rest)
    assert gathered.apply(x, lambda r: r * 10, lambda r: -r)[:, 0].tolist() == want


PROMPTS = [list(range(3, 3 + n)) for n in (37, 5, 70, 17, 33)]


@pytest.fixture(scope="module")
def q4_1_gguf(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("prompt_tiles")
    src = make_tiny_checkpoint(root / "hf", "llama", tiny_tokenizer, tie_word_embeddings=True)
    return write_gguf(src, root / "q4_1.gguf", "llama", gguf.GGMLQuantizationType.Q4_1)


def _generate(llm, prompts, max_tokens=6):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


def _bits(outputs):
    """Each output's tokens and the logprob of every chosen token."""
    return [(o.token_ids, [lp[t].logprob for t, lp in zip(o.token_ids, o.logprobs, strict=True)])
            for o in outputs]


def test_engine_prompts_on_tiles_do_not_depend_on_how_they_run(ops, q4_1_gguf, make_llm):
    """With the tiles on (emulated), the same tokens and the same logprobs, to the bit: whole
    prompts in one batch, each alone in chunks of 16 tokens, again from the prefix cache
    (a prompt's last token then runs alone, as a one-token chunk). Against the tiles off the
    first logprobs differ (the prompt rows did run on them) and the outputs are close by
    vLLM's rule."""
    with prompt_tiles(ops, "emulated"):
        _, batched = _same_bits_however_run(make_llm, q4_1_gguf)
    _differ_first_and_close(ops, make_llm, q4_1_gguf, batched)


def _same_bits_however_run(make_llm, path):
    """The engine (prefix caching on) and the PROMPTS' outputs batched through it, checked to
    the bit against the same engine again (every full block of each prompt from the prefix
    cache) and against each prompt alone in chunks of 16 tokens."""
    base = make_llm(path, enable_prefix_caching=True)
    batched = _generate(base, PROMPTS)
    cached = _generate(base, PROMPTS)
    chunked_llm = make_llm(path, enable_prefix_caching=False, max_num_batched_tokens=16)
    alone = [_generate(chunked_llm, [p])[0] for p in PROMPTS]
    assert _bits(cached) == _bits(batched)
    assert _bits(alone) == _bits(batched)
    return base, batched


def _differ_first_and_close(ops, make_llm, path, on_tiles):
    """Against the tiles off the first logprobs of `on_tiles` differ (the prompt rows did run
    on them) and the outputs are close by vLLM's rule."""
    with prompt_tiles(ops, "off"):
        off = _generate(make_llm(path, enable_prefix_caching=False), PROMPTS)
    first = [(o.token_ids[0], o.logprobs[0][o.token_ids[0]].logprob) for o in off]
    assert all(a != (b.token_ids[0], b.logprobs[0][b.token_ids[0]].logprob)
               for a, b in zip(first, on_tiles, strict=True))
    assert min(check_logprobs_close(a, b) for a, b in zip(off, on_tiles, strict=True)) >= 1


@pytest.fixture(scope="module")
def q4_1_gguf_d32(tmp_path_factory, tiny_tokenizer):
    """The tiny model with two heads of 32 (one KV head): a head size the attention tiles
    take (the default tiny model's 16 stays on the fp32 kernel)."""
    root = tmp_path_factory.mktemp("prompt_tiles_d32")
    src = make_tiny_checkpoint(root / "hf", "llama", tiny_tokenizer, tie_word_embeddings=True,
                               num_attention_heads=2, num_key_value_heads=1)
    return write_gguf(src, root / "q4_1.gguf", "llama", gguf.GGMLQuantizationType.Q4_1)


def test_engine_vector_tiles_take_only_the_attention(ops, q4_1_gguf_d32, make_llm,
                                                     monkeypatch):
    """vector: the prompt rows' attention runs on the tiles, their matrices stay on the int8
    panels (no bf16 matrix call, no bf16 tiles kept even when asked to keep them). The same
    tokens and logprobs, to the bit, batched, alone in chunks of 16 tokens and from the
    prefix cache; against the tiles off the first logprobs differ (the attention did run on
    the tiles) and the outputs are close by vLLM's rule."""
    calls = []
    for name in ("a8_panel_bf16_linear", "a8_panel_bf16_mlp"):
        kernel = getattr(ops, name)
        monkeypatch.setattr(ops, name, lambda *a, _k=kernel, _n=name: calls.append(_n) or _k(*a))
    monkeypatch.setenv(prompt_tile_weights.VARIABLE, "keep")
    with prompt_tiles(ops, "vector"):
        base, batched = _same_bits_however_run(make_llm, q4_1_gguf_d32)
        assert not any(_kept(base))
    assert calls == []
    with prompt_tiles(ops, "emulated"):  # (the matrices' calls are seen where they run)
        _generate(make_llm(q4_1_gguf_d32, enable_prefix_caching=False), PROMPTS[:1], 1)
    assert "a8_panel_bf16_linear" in calls
    _differ_first_and_close(ops, make_llm, q4_1_gguf_d32, batched)


@pytest.mark.slow
def test_tensor_parallel_ranks_keep_prompt_rows_on_int8(ops, q4_1_gguf, make_llm, monkeypatch):
    """Under tensor parallelism every rank keeps the prompt rows on the int8 path (rank 0 by
    its executor, the others in their replay of its step, whose batch has no requests): with
    the tiles asked for in every rank's process the same tokens and logprobs, to the bit, as
    with them off."""
    monkeypatch.setenv("PAGEDLLM_DIST_TIMEOUT_S", "120")
    runs = {}
    for mode in ("off", "emulated"):
        monkeypatch.setenv("PAGEDLLM_PROMPT_TILES", mode)  # the ranks' processes read it
        with prompt_tiles(ops, mode):
            llm = make_llm(q4_1_gguf, tensor_parallel_size=2, enable_prefix_caching=False)
            try:
                runs[mode] = _bits(_generate(llm, PROMPTS))
            finally:
                llm.llm_engine.shutdown()
    assert runs["emulated"] == runs["off"]


def _kept(llm) -> list[int]:
    """Bytes of bf16 tiles each panel linear of the engine's model keeps, lm_head last."""
    model = llm.llm_engine.model
    return [m.quant.tiles.numel() * 2 for m in prompt_tile_weights.prompt_linears(model)] + [
        model.lm_head.quant.tiles.numel() * 2]


def test_kept_tiles_policy_and_bits(ops, q4_1_gguf, make_llm, monkeypatch):
    """PAGEDLLM_PROMPT_TILE_WEIGHTS: keep (and auto, for a tiny model) keeps every prompt
    linear's bf16 tiles and none for the lm_head (logits never run as prompt rows), with the
    same tokens and logprobs, to the bit, as dequantize; an unknown value is one clear
    error before anything loads."""
    runs = {}
    with prompt_tiles(ops, "emulated"):
        for policy in ("dequantize", "keep", "auto"):
            monkeypatch.setenv(prompt_tile_weights.VARIABLE, policy)
            llm = make_llm(q4_1_gguf, enable_prefix_caching=False)
            kept = _kept(llm)
            assert kept[-1] == 0 and len(kept) > 1
            assert all(kept[:-1]) if policy != "dequantize" else not any(kept)
            runs[policy] = _bits(_generate(llm, PROMPTS))
        monkeypatch.setenv(prompt_tile_weights.VARIABLE, "always")
        with pytest.raises(InvalidInputError, match="PAGEDLLM_PROMPT_TILE_WEIGHTS must be"):
            make_llm(q4_1_gguf)
    assert runs["keep"] == runs["dequantize"] == runs["auto"]
    monkeypatch.setenv(prompt_tile_weights.VARIABLE, "keep")
    with prompt_tiles(ops, "off"):  # no prompt rows on the tiles: nothing kept
        assert not any(_kept(make_llm(q4_1_gguf)))


def test_auto_keeps_tiles_only_within_the_limits(ops, monkeypatch):
    """auto: at most AUTO_LIMIT bytes and a quarter of the memory available."""
    if (why := _why_not("emulated")) is not None:
        pytest.skip(why)
    w = GGUFA8PanelWeight.from_blocks(gguf.GGMLQuantizationType.Q4_0,
                                      random_blocks(gguf.GGMLQuantizationType.Q4_0, 64, 64,
                                                    seed=2), (64, 64))
    model = torch.nn.Module()
    model.proj = Linear(64, 64)
    model.proj.set_quantized(w)
    monkeypatch.setenv(prompt_tile_weights.VARIABLE, "auto")
    monkeypatch.setattr(prompt_tile_weights, "available_bytes", lambda: 4 * 8192 - 4)
    assert prompt_tile_weights.keep_tiles(model) == 0  # 8 KiB > a quarter of the memory
    monkeypatch.setattr(prompt_tile_weights, "available_bytes", lambda: 4 * 8192)
    monkeypatch.setattr(prompt_tile_weights, "AUTO_LIMIT", 8191)
    assert prompt_tile_weights.keep_tiles(model) == 0
    monkeypatch.setattr(prompt_tile_weights, "AUTO_LIMIT", 8192)
    assert prompt_tile_weights.keep_tiles(model) == 8192 == w.tiles.numel() * 2
