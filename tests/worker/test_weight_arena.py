"""The weights in one huge-page mapping (worker/weight_arena.py): every weight the model's
layers hold moves there (MoE experts' quantized weights and grouped stacks too), tensors that
shared storage (a tied GGUF table) still share it, the mapping is advised for huge pages, and
greedy tokens and logprobs are the same as with the weights where they were loaded
(PAGEDLLM_WEIGHT_ARENA=0)."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import torch

from pagedllm import SamplingParams
from pagedllm.model.layers.moe import experts as experts_mod
from pagedllm.model.layers.quant import LinearMethod
from pagedllm.model.layers.quant.gguf import GGUFWeight
from pagedllm.worker import weight_arena
from tests.conftest import make_tiny_checkpoint
from tests.loader.gguf_writer import write_gguf
from tests.model.family_checkpoints import make_family_checkpoint

PROMPTS = [[5, 9, 200, 17], list(range(30, 63)), [7] * 20]
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=3)


@pytest.fixture(scope="module")
def tied_q4_1(tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny Llama in GGUF Q4_1 with a tied embedding (the lm_head adopts the table)."""
    root = tmp_path_factory.mktemp("arena")
    src = make_tiny_checkpoint(root / "hf", "llama", tiny_tokenizer, tie_word_embeddings=True)
    return write_gguf(src, root / "tied-q4_1.gguf", "llama", gguf.GGMLQuantizationType.Q4_1)


def weight_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """What the arena moves: parameters, buffers and the weight holders' tensors."""
    found: list[torch.Tensor] = [t for t in (*model.parameters(), *model.buffers())
                                 if t.numel()]
    for holder in weight_arena.weight_holders(model):
        holder.relocate(lambda t: found.append(t) or t if t.numel() else t)
    return found


def mapping_of(address: int) -> tuple[int, int, list[str]]:
    """(start, end, VmFlags) of the mapping of this process that holds `address`."""
    start = end = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            a, b = (int(x, 16) for x in head.split("-"))
            start, end = (a, b) if a <= address < b else (None, None)
        elif head == "VmFlags:" and start is not None:
            return start, end, line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def generate(llm) -> list:
    return [o.outputs[0] for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


@pytest.mark.parametrize("extra", [{}, {"int8_activations": False}],
                         ids=["a8-panels", "gguf-rows"])
def test_gguf_weights_in_one_mapping(tied_q4_1: Path, make_llm, monkeypatch, extra) -> None:
    llm = make_llm(tied_q4_1, enable_prefix_caching=False, **extra)
    model = llm.llm_engine.model
    tensors = weight_tensors(model)
    start, end, flags = mapping_of(tensors[0].data_ptr())
    assert "hg" in flags  # MADV_HUGEPAGE
    assert all(start <= t.data_ptr() < end for t in tensors)
    assert model.lm_head.method is model.model.embed_tokens.quant  # tied: held once
    arena = generate(llm)

    monkeypatch.setenv("PAGEDLLM_WEIGHT_ARENA", "0")
    loaded = make_llm(tied_q4_1, enable_prefix_caching=False, **extra)
    others = weight_tensors(loaded.llm_engine.model)
    assert any(not start <= t.data_ptr() < end for t in others)
    for a, b in zip(arena, generate(loaded), strict=True):
        assert a.token_ids == b.token_ids
        for pa, pb in zip(a.logprobs, b.logprobs, strict=True):
            assert {t: p.logprob for t, p in pa.items()} == {t: p.logprob for t, p in pb.items()}


@pytest.mark.parametrize("extra", [{}, {"dtype": "bfloat16"}, {"quantization": "int8"}],
                         ids=["fp32-packed", "bf16", "int8"])
def test_float_and_int8_weights_move(tiny_llama_dir: Path, make_llm, extra, hf_reference
                                     ) -> None:
    llm = make_llm(tiny_llama_dir, enable_prefix_caching=False, **extra)
    tensors = weight_tensors(llm.llm_engine.model)
    start, end, _ = mapping_of(tensors[0].data_ptr())
    assert all(start <= t.data_ptr() < end for t in tensors)
    if not extra:  # fp32: the reference's tokens
        want, _ = hf_reference.greedy(tiny_llama_dir, PROMPTS[1], 16)
        assert generate(llm)[1].token_ids == want


def expert_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """The tensors of every MoE layer's quantized experts and grouped stacks, found by
    walking them directly (not through the arena's holder list)."""
    found: list[torch.Tensor] = []

    def walk(value) -> None:
        if isinstance(value, torch.Tensor):
            found.extend([value] if value.numel() else [])
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)
        elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module)):
            for v in vars(value).values():
                walk(v)

    for m in model.modules():
        if isinstance(m, experts_mod.StackedExperts):
            walk(m.quant)
            walk(m.packed)
    return found


@pytest.mark.parametrize("fmt", ["fp32", "q8_0"])
def test_moe_experts_move(tmp_path_factory, tiny_tokenizer, make_llm, monkeypatch, fmt) -> None:
    """A tiny Mixtral: fp32 experts in their grouped panels, or GGUF Q8_0 experts (per-expert
    weights and the grouped stacks): all in the mapping; the same tokens and logprobs."""
    root = tmp_path_factory.mktemp("moe-arena")
    path = make_family_checkpoint(root / "hf", "mixtral", tiny_tokenizer, seed=40,
                                  intermediate_size=64)
    if fmt == "q8_0":
        path = write_gguf(path, root / "q8_0.gguf", "llama", gguf.GGMLQuantizationType.Q8_0)
    llm = make_llm(path, enable_prefix_caching=False)
    experts = expert_tensors(llm.llm_engine.model)
    assert experts
    start, end, flags = mapping_of(weight_tensors(llm.llm_engine.model)[0].data_ptr())
    assert "hg" in flags and all(start <= t.data_ptr() < end for t in experts)
    monkeypatch.setenv("PAGEDLLM_WEIGHT_ARENA", "0")
    loaded = make_llm(path, enable_prefix_caching=False)
    assert not any(start <= t.data_ptr() < end for t in expert_tensors(loaded.llm_engine.model))
    for a, b in zip(generate(llm), generate(loaded), strict=True):
        assert a.token_ids == b.token_ids
        for pa, pb in zip(a.logprobs, b.logprobs, strict=True):
            assert {t: p.logprob for t, p in pa.items()} == {t: p.logprob for t, p in pb.items()}


def test_relocate_replaces_every_tensor_a_method_holds() -> None:
    """Tensors in tuples (GGUFWeight's kernel arguments) and stacked parts move too; shared
    storage stays shared when `place` keeps it so."""
    t = gguf.GGMLQuantizationType.Q8_0
    w = torch.randn(64, 64).numpy()
    weight = GGUFWeight.from_blocks(t, gguf.quants.quantize(w, t), w.shape)
    x = torch.randn(3, 64)
    want = weight.linear(x)
    old = {id(v) for v in vars(weight).values() if isinstance(v, torch.Tensor)}
    moved: list[torch.Tensor] = []

    def place(tensor: torch.Tensor) -> torch.Tensor:
        moved.append(tensor.clone())
        return moved[-1]

    weight.relocate(place)
    held = [v for v in vars(weight).values() if isinstance(v, torch.Tensor)]
    held += [v for v in vars(weight).values() if isinstance(v, tuple)
             for v in v if isinstance(v, torch.Tensor)]
    assert held and not any(id(v) in old for v in held)
    assert all(any(v is m for m in moved) for v in held)
    torch.testing.assert_close(weight.linear(x), want, rtol=0, atol=0)
    assert isinstance(weight, LinearMethod)


def test_off_by_environment(tiny_llama_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("PAGEDLLM_WEIGHT_ARENA", "0")
    assert weight_arena.into_huge_pages(torch.nn.Linear(4, 4)) == 0
