"""Beam search (vLLM's `BeamSearchParams` / `BeamSearchOutput`), with HF's search semantics.

The search is driven from outside the engine, as vLLM v1 does it: each step submits every
live beam as a request of its own (prompt = the beam's tokens, `max_tokens=1`, the top
`2 * beam_width` logprobs) and `BeamSearchInstance.advance` turns the answers into the next
beams. The KV of the beams' common prefix is shared through the prefix cache: a step's
requests hit the full blocks their parents computed (the block manager counts one reference
per beam holding a block), so each beam computes only its last, partly filled block.

One step of one prompt (k = beam_width; HF `generate(num_beams=k, do_sample=False)`)::

    candidates = {(beam, token): beam.cum_logprob + logprob(token | beam)}   top 2k of each beam
    top 2k candidates overall, best first:
        rank < k and (token is EOS or max_tokens reached)  -> a finished hypothesis,
            score = cum_logprob / generated_len ** length_penalty        (EOS counted)
        rank >= k and EOS                                  -> dropped
        otherwise                                          -> running, the first k are kept
    finished hypotheses: the best k are kept (`completed`, best first)
    stop when: max_tokens reached, early_stopping=True and k finished, or (k finished and)
        the best running beam cannot beat the worst finished one (HF's heuristic, its
        length being the current one, or max_tokens for early_stopping="never" with a
        positive length_penalty)

The per-beam top 2k holds the global top 2k (no beam contributes more than 2k of them).
Differences from vLLM's `LLM.beam_search`: the length in the penalty is the generated length
(HF's, not prompt + generated), EOS candidates below rank k are not finished hypotheses, and
`early_stopping` is honoured (vLLM's v1 loop always runs `max_tokens` steps).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pagedllm.errors import InvalidInputError, InvariantError
from pagedllm.outputs import Logprob

EarlyStopping = bool | Literal["never"]


class InvalidBeamSearchParams(InvalidInputError):
    """A `BeamSearchParams` field is out of range (the message names it and the limit)."""


class BeamSearchStateError(InvariantError):
    """A step's logprobs do not match the live beams, or the search already ended."""


@dataclass
class BeamSearchParams:
    """vLLM's beam search parameters, validated at construction.

    `beam_width`: beams kept per prompt (and sequences returned). `max_tokens`: generated
    tokens at most. `ignore_eos`: EOS is an ordinary token (every beam runs `max_tokens`).
    `temperature`: the search is deterministic over the raw logprobs (as vLLM v1 scores it);
    only 0 is accepted, so that a temperature is never silently ignored.
    `length_penalty`: finished scores are cum_logprob / generated_len ** length_penalty
    (> 0 favours longer sequences). `early_stopping` (HF's): True, False or "never".
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    early_stopping: EarlyStopping = False

    def __post_init__(self) -> None:
        for name in ("beam_width", "max_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidBeamSearchParams(f"{name} must be an integer >= 1, got {value!r}")
        if self.temperature != 0.0:
            raise InvalidBeamSearchParams(
                "beam search is deterministic (it scores the raw logprobs): temperature must "
                f"be 0, got {self.temperature}"
            )
        if not math.isfinite(self.length_penalty):
            raise InvalidBeamSearchParams(
                f"length_penalty must be a finite number, got {self.length_penalty}"
            )
        if self.early_stopping not in (True, False, "never"):
            raise InvalidBeamSearchParams(
                f"early_stopping must be true, false or 'never', got {self.early_stopping!r}"
            )

    @property
    def num_candidates(self) -> int:
        """Logprobs asked of each beam per step: 2 * beam_width (HF's and vLLM's)."""
        return 2 * self.beam_width


@dataclass
class BeamSearchSequence:
    """One beam: `tokens` holds the prompt then the generated tokens (vLLM's shape);
    `logprobs` one entry per generated token (that step's top logprobs of its parent);
    `score` the length-penalized score it was ranked by once finished."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None
    score: float | None = None


@dataclass
class BeamSearchOutput:
    """The best `beam_width` sequences of one prompt, best score first."""

    sequences: list[BeamSearchSequence]


def get_beam_search_score(num_generated: int, cum_logprob: float, length_penalty: float) -> float:
    """HF's finished-hypothesis score: the generated length counts a final EOS."""
    return cum_logprob / (num_generated**length_penalty)


class BeamSearchInstance:
    """The search state of one prompt; `advance` applies one step's logprobs."""

    def __init__(
        self, prompt_token_ids: Sequence[int], params: BeamSearchParams, eos_token_id: int | None
    ) -> None:
        self.params = params
        self.eos_token_id = None if params.ignore_eos else eos_token_id
        self.num_prompt_tokens = len(prompt_token_ids)
        self.beams = [BeamSearchSequence(tokens=list(prompt_token_ids))]
        self.completed: list[BeamSearchSequence] = []  # best first, at most beam_width
        self._improvable = True  # HF's "early stop heuristic unsatisfied"
        self.done = False

    @property
    def num_generated(self) -> int:
        """Tokens generated by the live beams (all of one length)."""
        return len(self.beams[0].tokens) - self.num_prompt_tokens

    def advance(self, step_logprobs: Sequence[dict[int, Logprob]]) -> None:
        """One step: `step_logprobs[i]` is the next-token top logprobs of `self.beams[i]`."""
        if self.done:
            raise BeamSearchStateError("advance() on a finished beam search")
        if len(step_logprobs) != len(self.beams):
            raise BeamSearchStateError(
                f"{len(step_logprobs)} logprobs rows for {len(self.beams)} beams"
            )
        k, p = self.params.beam_width, self.params
        cands = [
            (beam.cum_logprob + lp.logprob, beam, tok, row)
            for beam, row in zip(self.beams, step_logprobs, strict=True)
            for tok, lp in row.items()
        ]
        cands.sort(key=lambda c: c[0], reverse=True)
        length = self.num_generated + 1
        at_limit = length >= p.max_tokens
        running, finished = [], []
        for rank, (total, beam, tok, row) in enumerate(cands[: p.num_candidates]):
            is_eos = tok == self.eos_token_id
            if is_eos or at_limit:
                if rank < k:
                    finished.append(
                        BeamSearchSequence(
                            beam.tokens + [tok],
                            beam.logprobs + [row],
                            total,
                            finish_reason="stop" if is_eos else "length",
                            score=get_beam_search_score(length, total, p.length_penalty),
                        )
                    )
            elif len(running) < k:
                running.append(
                    BeamSearchSequence(beam.tokens + [tok], beam.logprobs + [row], total)
                )
        full = len(self.completed) == k
        if self._improvable and not (full and p.early_stopping is True):
            self.completed = sorted(self.completed + finished, key=_score, reverse=True)[:k]
        self.beams = running
        full = len(self.completed) == k
        if full and running:
            horizon = (
                p.max_tokens if p.early_stopping == "never" and p.length_penalty > 0 else length
            )
            best = get_beam_search_score(horizon, running[0].cum_logprob, p.length_penalty)
            self._improvable = self._improvable and best > self.completed[-1].score
        self.done = (
            at_limit or not running or not self._improvable or (full and p.early_stopping is True)
        )

    def output(self) -> BeamSearchOutput:
        """The finished hypotheses, best first (topped up with live beams if the search was
        cut short, e.g. by max_model_len)."""
        seqs = list(self.completed)
        for beam in self.beams[: self.params.beam_width - len(seqs)]:
            beam.finish_reason = "length"
            beam.score = get_beam_search_score(
                max(self.num_generated, 1), beam.cum_logprob, self.params.length_penalty
            )
            seqs.append(beam)
        return BeamSearchOutput(sorted(seqs, key=_score, reverse=True))


def _score(seq: BeamSearchSequence) -> float:
    return seq.score if seq.score is not None else -math.inf
