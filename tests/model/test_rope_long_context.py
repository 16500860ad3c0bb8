"""Long prompts past the original context, per rope scaling type: greedy tokens vs HF.

A tiny Llama with max_position_embeddings=256 gets a 2,085-token prompt (not a multiple of
the block size or of the chunk), prefilled in 512-token chunks. HF runs `generate` with its
KV cache and the same `prefill_chunk_size`, so dynamic NTK sees the same forward-call
lengths on both sides (see pagedllm/model/layers/rotary.py).

The q/k/v projections are scaled up: with the plain tiny checkpoint, attention over 2,000
random tokens averages out and every rope type greedily repeats one token, which would
test nothing. The sampled tokens' logprobs are compared too, for sensitivity.
"""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedllm import SamplingParams
from tests.conftest import make_tiny_checkpoint

ORIGINAL_LEN = 256
FACTOR = 16.0
PROMPT_LEN = 2085
CHUNK = 512
MAX_TOKENS = 12
ROPE = {
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": FACTOR},
    "dynamic": {"rope_type": "dynamic", "factor": FACTOR},
    "yarn": {"rope_type": "yarn", "factor": FACTOR, "original_max_position_embeddings": 256},
    "llama3": {"rope_type": "llama3", "factor": FACTOR, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
}
PROMPT = [random.Random(7).randrange(2, 512) for _ in range(PROMPT_LEN)]
LOGPROB_TOL = 1e-4  # observed: <= 3e-6


def sharpen_attention(model_dir: Path, scale: float = 3.0) -> None:
    path = model_dir / "model.safetensors"
    weights = load_file(path)
    for name, w in weights.items():
        if any(f"self_attn.{p}_proj" in name for p in "qkv"):
            weights[name] = w * scale
    save_file(weights, path, metadata={"format": "pt"})


@pytest.fixture(scope="module")
def rope_dir(tmp_path_factory, tiny_tokenizer):
    @cache
    def get(rope_type: str) -> Path:
        path = make_tiny_checkpoint(
            tmp_path_factory.mktemp(f"rope_{rope_type}"), "llama", tiny_tokenizer, seed=3,
            max_position_embeddings=ORIGINAL_LEN,
            rope_parameters={**ROPE[rope_type], "rope_theta": 10000.0})
        sharpen_attention(path)
        return path

    return get


@cache
@torch.inference_mode()
def hf_greedy(model_dir: Path, chunk: int | None, n: int = PROMPT_LEN
              ) -> tuple[list[int], list[float]]:
    """HF `generate` on PROMPT[:n] with its KV cache: (tokens, logprob of each token)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = model.eval().generate(
        torch.tensor([PROMPT[:n]]), attention_mask=torch.ones(1, n, dtype=torch.long),
        max_new_tokens=MAX_TOKENS, do_sample=False, prefill_chunk_size=chunk,
        pad_token_id=1, eos_token_id=None, return_dict_in_generate=True, output_logits=True)
    tokens = out.sequences[0, n:].tolist()
    logprobs = [torch.log_softmax(step[0].float(), -1)[t].item()
                for step, t in zip(out.logits, tokens, strict=True)]
    return tokens, logprobs


def pagedllm_greedy(llm, lengths: tuple[int, ...] = (PROMPT_LEN,)
                    ) -> list[tuple[list[int], list[float]]]:
    """One batch of PROMPT[:n] for each n: [(tokens, logprob of each token)]."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": PROMPT[:n]} for n in lengths], params,
                        use_tqdm=False)
    return [(o.token_ids, [lp[t].logprob for lp, t in zip(o.logprobs, o.token_ids, strict=True)])
            for o in (out.outputs[0] for out in outs)]


def assert_same(got: tuple[list[int], list[float]], expected: tuple[list[int], list[float]]):
    assert got[0] == expected[0]
    assert got[1] == pytest.approx(expected[1], abs=LOGPROB_TOL)


@pytest.mark.parametrize("rope_type", list(ROPE))
def test_long_prompt_greedy_matches_hf(rope_type, rope_dir, make_llm) -> None:
    model_dir = rope_dir(rope_type)
    default = rope_type == "default"
    llm = make_llm(model_dir, max_num_batched_tokens=CHUNK, block_size=16,
                   allow_long_max_model_len=default,
                   max_model_len=PROMPT_LEN + MAX_TOKENS if default else None)
    engine = llm.llm_engine
    assert engine.model.model.rotary.params["rope_type"] == rope_type
    expected_len = PROMPT_LEN + MAX_TOKENS if default else int(ORIGINAL_LEN * FACTOR)
    assert engine.config.max_model_len == expected_len
    assert_same(pagedllm_greedy(llm)[0], hf_greedy(model_dir, CHUNK))


def test_references_tell_the_rope_types_apart(rope_dir) -> None:
    """The HF references differ between types and, for dynamic, between chunkings; so the
    comparisons above would catch a wrong type or wrong dynamic lengths."""
    tokens = {t: tuple(hf_greedy(rope_dir(t), CHUNK)[0]) for t in ROPE}
    assert len(set(tokens.values())) == len(ROPE)
    assert all(len(set(seq)) > 1 for t, seq in tokens.items() if t != "default")
    assert hf_greedy(rope_dir("dynamic"), None)[0] != list(tokens["dynamic"])


def test_dynamic_is_per_sequence_in_a_batch(rope_dir, make_llm) -> None:
    """Prompts prefilled whole in one step, then decoded together: each sequence gets the
    frequencies for its own length (HF's unchunked `generate` of that prompt alone), not
    the batch's longest."""
    model_dir = rope_dir("dynamic")
    lengths = (PROMPT_LEN, 1200, 200)
    llm = make_llm(model_dir, max_num_batched_tokens=sum(lengths))
    for got, n in zip(pagedllm_greedy(llm, lengths), lengths, strict=True):
        assert_same(got, hf_greedy(model_dir, None, n))


def test_rope_overrides_match_a_checkpoint_saved_with_them(rope_dir, make_llm) -> None:
    """--rope-scaling / --rope-theta on a plain checkpoint == a checkpoint saved with them."""
    llm = make_llm(rope_dir("default"), max_num_batched_tokens=CHUNK, rope_theta=10000.0,
                   rope_scaling='{"type": "yarn", "factor": 16.0}')
    rotary = llm.llm_engine.model.model.rotary
    assert rotary.params["original_max_position_embeddings"] == ORIGINAL_LEN
    assert_same(pagedllm_greedy(llm)[0], hf_greedy(rope_dir("yarn"), CHUNK))
