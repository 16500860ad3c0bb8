"""Beam-search test helpers: a tiny random Llama whose EOS the beams often propose (so
hypotheses finish at different lengths and length_penalty / early_stopping decide), and HF
`generate(num_beams=...)` as the reference."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import make_tiny_checkpoint

EOS = 207  # a token the beams of this checkpoint (seed 5, weights x2) propose often
PROMPTS = [
    "Hello there, how are",
    "The quick brown fox jumps over the lazy dog and",
    "In the beginning",
    "def f(x): return",
    "A",
]


def make_beam_checkpoint(path: Path, tokenizer) -> Path:
    return make_tiny_checkpoint(
        path, "llama", tokenizer, seed=5, weight_scale=2.0, eos_token_id=EOS
    )


def hf_beams(
    model, prompt: list[int], num_beams: int, max_tokens: int, eos: int | None = EOS, **kwargs
) -> tuple[list[list[int]], list[float]]:
    """HF's `num_return_sequences=num_beams` beams (the generated tokens, up to and with the
    first EOS: HF pads with EOS) and their scores."""
    out = model.generate(
        torch.tensor([prompt]),
        num_beams=num_beams,
        do_sample=False,
        num_return_sequences=num_beams,
        max_new_tokens=max_tokens,
        return_dict_in_generate=True,
        output_scores=True,
        pad_token_id=0,
        eos_token_id=eos,
        **kwargs,
    )
    beams = []
    for seq in out.sequences[:, len(prompt) :].tolist():
        beams.append(seq[: seq.index(eos) + 1] if eos is not None and eos in seq else seq)
    return beams, out.sequences_scores.tolist()
