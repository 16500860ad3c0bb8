"""Batched next-token sampling (vLLM v1 semantics), one row per sequence that samples.

Pipeline, all in float32 whatever the model dtype::

    raw logits --log_softmax--> logprobs (reported)
        |
        +-> the step's logits processors (logits_processors.py): grammar bitmask,
        |   allowed_token_ids, bad_words, logit_bias -> min_tokens -> penalties
              |-> greedy rows:  argmax
              '-> random rows:  / temperature -> min_p -> top_k -> top_p
                                -> softmax -> inverse CDF at u,  u ~ U[0, 1)

On the CPU the random rows' last steps (temperature, min_p or the top-k / top-p thresholds,
softmax and the inverse CDF) are C++ kernels over the logits (kernels/sampling_cpu.cpp,
kernels/top_k_top_p_cpu.cpp), the same draw with no [B, V] temporaries: at 64 rows a Zen 3
pair's step with temperature 13 -> 2 ms, with top-p 32 -> 7 ms.

Seeded rows draw ``u`` from their own generator, so their samples do not depend on
which other requests share the batch; unseeded rows draw from the sampler's generator
(seeded from the engine's ``seed``), so a run is reproducible given that seed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from pagedllm.kernels import cpu_ops
from pagedllm.model.layers.logits_processors import (
    LogitsProcessor,
    Penalties,
    build_processors,
)
from pagedllm.model.layers.token_constraints import TokenConstraints
from pagedllm.model.layers.top_k_top_p import scaled_logits, top_k_top_p_threshold
from pagedllm.sampling_params import SamplingParams
from pagedllm.structured_output.bitmask import GrammarBitmask


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A generator on ``device`` seeded with ``seed``; one per seeded request."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


@dataclass
class SamplingRow:
    """What the sampler needs to know about one sequence this step."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None = None
    eos_token_id: int | None = None


@dataclass
class LogprobsTensors:
    """Logprobs of the raw (unpenalised, unscaled) logits; N = max_num_logprobs."""

    sampled_logprobs: torch.Tensor  # [B] float32, logprob of the sampled token
    sampled_ranks: torch.Tensor  # [B] int64, 1 = most likely token
    topk_token_ids: torch.Tensor  # [B, N] int64, most likely first
    topk_logprobs: torch.Tensor  # [B, N] float32, descending


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [B] int64
    logprobs: LogprobsTensors | None
    # Set by the greedy host path: (ids, whether each row's logits were finite) as lists,
    # so that the step's device -> host copy (worker/sampling_rows.py) has nothing to do.
    host: tuple[list[int], list[bool]] | None = None


@dataclass(frozen=True)
class SamplingMetadata:
    """Batched sampling parameters; row i of every tensor is sequence i.

    Optional tensors are ``None`` when no row uses the feature, so the sampler skips it.
    Token id tensors are padded with ``vocab_size``, which must equal ``logits.shape[-1]``.
    """

    temperatures: tuple[float, ...]  # [B]; 0 for greedy rows
    device: torch.device | str
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None  # [B] int64, vocab_size where disabled
    top_p: torch.Tensor | None  # [B] float32
    min_p: torch.Tensor | None  # [B] float32
    presence_penalties: torch.Tensor | None  # [B] float32
    frequency_penalties: torch.Tensor | None  # [B] float32
    repetition_penalties: torch.Tensor | None  # [B] float32
    # Built iff a row uses a penalty: occurrences of each token in the row's output, and
    # whether it occurs in the prompt (read by the repetition penalty only).
    output_counts: torch.Tensor | None  # [B, V] int32
    prompt_mask: torch.Tensor | None  # [B, V] bool
    min_tokens_stop_ids: dict[int, set[int]]  # row -> ids banned until min_tokens reached
    generators: dict[int, torch.Generator]  # row -> generator of a seeded random row
    max_num_logprobs: int | None  # None: no row wants logprobs
    # The constrained rows' grammar bitmask, other restrictions (logit bias, bad words, ...).
    grammar: GrammarBitmask | None = None
    constraints: TokenConstraints | None = None
    # What changes the scores before sampling, in order (logits_processors.py).
    processors: tuple[LogitsProcessor, ...] = ()

    @functools.cached_property
    def temperature(self) -> torch.Tensor:
        """[B] float32 on the device, made when a random row needs it (an all-greedy step,
        the common decode case, makes no tensor here)."""
        return torch.tensor(self.temperatures, dtype=torch.float32, device=self.device)

    @classmethod
    def build(
        cls, rows: list[SamplingRow], vocab_size: int, device: torch.device | str,
        penalty_state: tuple[torch.Tensor, torch.Tensor] | None = None,
        grammar: GrammarBitmask | None = None, constraints: TokenConstraints | None = None,
    ) -> SamplingMetadata:
        """`penalty_state`: (output counts, prompt mask) kept incrementally by the caller
        (worker/persistent_batch.py); without it they are built from the rows' token lists.
        `grammar` / `constraints`: the logits processors' masks for these rows."""
        ps = [r.params for r in rows]
        greedy = [p.is_greedy for p in ps]

        def f32(values: list[float], neutral: float) -> torch.Tensor | None:
            if all(v == neutral for v in values):
                return None
            return torch.tensor(values, dtype=torch.float32, device=device)

        top_k = None
        if any(p.top_k > 0 for p in ps):
            ks = [min(p.top_k, vocab_size) if p.top_k > 0 else vocab_size for p in ps]
            top_k = torch.tensor(ks, dtype=torch.int64, device=device)
        presence = f32([p.presence_penalty for p in ps], 0.0)
        frequency = f32([p.frequency_penalty for p in ps], 0.0)
        repetition = f32([p.repetition_penalty for p in ps], 1.0)
        any_penalty = any(t is not None for t in (presence, frequency, repetition))

        stop_ids: dict[int, set[int]] = {}
        for i, r in enumerate(rows):
            if (len(r.output_token_ids) < r.params.min_tokens
                    and (ids := set(r.params.ending_token_ids(r.eos_token_id)))):
                stop_ids[i] = ids
        wants = [p.logprobs for p in ps if p.logprobs is not None]
        if any_penalty and penalty_state is None:
            penalty_state = (
                _token_counts(_pad([r.output_token_ids for r in rows], vocab_size, device),
                              vocab_size),
                _token_counts(_pad([r.prompt_token_ids for r in rows], vocab_size, device),
                              vocab_size) > 0)
        counts = penalty_state[0] if any_penalty else None
        prompt_mask = penalty_state[1] if any_penalty else None
        penalties = (Penalties(counts, prompt_mask, repetition, frequency, presence)
                     if any_penalty else None)
        return cls(
            temperatures=tuple(0.0 if g else p.temperature
                               for p, g in zip(ps, greedy, strict=True)),
            device=device,
            all_greedy=all(greedy),
            all_random=not any(greedy),
            top_k=top_k,
            top_p=f32([p.top_p for p in ps], 1.0),
            min_p=f32([p.min_p for p in ps], 0.0),
            presence_penalties=presence,
            frequency_penalties=frequency,
            repetition_penalties=repetition,
            output_counts=counts,
            prompt_mask=prompt_mask,
            min_tokens_stop_ids=stop_ids,
            generators={
                i: r.generator
                for i, r in enumerate(rows)
                if r.generator is not None and not greedy[i]
            },
            max_num_logprobs=max(wants) if wants else None,
            grammar=grammar,
            constraints=constraints,
            processors=build_processors(grammar, constraints, stop_ids, penalties),
        )


def _pad(seqs: list[list[int]], pad: int, device: torch.device | str) -> torch.Tensor:
    width = max((len(s) for s in seqs), default=0)
    padded = [list(s) + [pad] * (width - len(s)) for s in seqs]
    return torch.tensor(padded, dtype=torch.int64, device=device).view(len(seqs), width)


class Sampler(torch.nn.Module):
    """Turns last-position logits ``[B, V]`` into one token id per row (see module doc).

    `generator` serves the random rows without a seed of their own (None: torch's global one).
    """

    def __init__(self, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.generator = generator

    def forward(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        # The caller's logits are never modified: processors (which may work in place) get a
        # float32 copy; without any, nothing below writes into `logits`, so float32 logits are
        # read as they are (a [B, V] copy cost ~0.1-0.9 ms per step, a page fault per 4 KiB).
        logits = logits.to(dtype=torch.float32, copy=bool(md.processors))
        if md.all_greedy and not md.processors and md.max_num_logprobs is None \
                and logits.device.type == "cpu":
            return _greedy_on_host(logits)
        raw = None if md.max_num_logprobs is None else torch.log_softmax(logits, dim=-1)
        logits = _processed(logits, md)

        greedy_ids = None if md.all_random else row_argmax(logits)
        if md.all_greedy:
            sampled = greedy_ids
        else:
            random_ids = _sample_random(logits, md, self.generator)
            if md.all_random:
                sampled = random_ids
            else:
                sampled = torch.where(md.temperature == 0.0, greedy_ids, random_ids)

        logprobs = None
        if raw is not None:
            logprobs = _gather_logprobs(raw, sampled, md.max_num_logprobs)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    def probs(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """[B, V] the distribution each random row samples from (restrictions, penalties,
        temperature, min_p, top-k/p applied), for speculative decoding's rejection sampler."""
        logits = _processed(logits.to(dtype=torch.float32, copy=True), md)
        return _random_probs(logits, md)

    @staticmethod
    def gather_logprobs(logits: torch.Tensor, token_ids: torch.Tensor, n: int
                        ) -> LogprobsTensors:
        """Raw logprobs of `token_ids` (one per row) and each row's top `n`."""
        raw = torch.log_softmax(logits.to(dtype=torch.float32), dim=-1)
        return _gather_logprobs(raw, token_ids, n)


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """[B] int64 argmax of each row of a float [B, V] tensor: numpy's on the CPU (the same
    answer as torch's: the first maximum, a NaN counting as the maximum; 4-100x faster there
    for vocabulary-sized rows), torch's elsewhere."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return x.argmax(dim=-1)
    return torch.from_numpy(x.detach().numpy().argmax(axis=-1))


def _greedy_on_host(logits: torch.Tensor) -> SamplerOutput:
    """Greedy rows of CPU logits with nothing to process, by numpy: its argmax (the first
    maximum, a NaN counting as the maximum, as torch's) and the finiteness check cost ~15 us
    for a 49,152-token row where torch's argmax, gather, isfinite and stack cost ~0.2 ms
    (~0.1 vs ~0.35 ms in a decode step, whose weight streaming has evicted the caches).
    Contiguous fp32 logits take the C++ `greedy_rows` instead (the same first maximum, the
    rows split over the threads; a row that is not finite, which the runner reports, gets
    numpy's pick): Gemma 3 270M's 64 rows of 262,144 logits, offline, 1.022x (SmolLM2's
    49,152: even)."""
    ops = cpu_ops.fp32_ops(logits)
    if ops is not None and logits.dim() == 2 and logits.is_contiguous() and logits.shape[1]:
        found = ops.greedy_rows(logits)
        finite = (found >= 0).tolist()
        if not all(finite):  # such a row's id as numpy's / torch's argmax gives it
            bad = found < 0
            found[bad] = torch.from_numpy(logits[bad].detach().numpy().argmax(axis=-1))
        return SamplerOutput(found, None, host=(found.tolist(), finite))
    a = logits.detach().numpy()
    ids = a.argmax(axis=-1)
    finite = np.isfinite(a[np.arange(len(ids)), ids])
    return SamplerOutput(torch.from_numpy(ids), None, host=(ids.tolist(), finite.tolist()))


def _processed(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """The step's logits processors, in order, on a float32 copy."""
    for process in md.processors:
        logits = process(logits)
    return logits


def _token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[B, L] ids padded with vocab_size -> [B, V] occurrence counts (pad column dropped)."""
    counts = torch.zeros(
        token_ids.shape[0], vocab_size + 1, dtype=torch.int64, device=token_ids.device
    )
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids))
    return counts[:, :vocab_size]


def _sample_random(logits: torch.Tensor, md: SamplingMetadata,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row from its distribution by the inverse CDF: a uniform u per row (from
    the row's own generator if seeded, else `generator`), the first token whose cumulative
    probability (float64) exceeds u times the row's total. One random number per row, where
    an exponential race needs one per token (~1 ms for a 49,152-token row on the CPU).
    Float32 CPU logits take the C++ kernel (kernels/sampling_cpu.cpp: the same draw from
    the logits with no [B, V] temporaries); elsewhere softmax, cumsum and searchsorted."""
    # Greedy rows are sampled here too (with temperature 1) and replaced by the caller.
    u = step_uniforms(generator, md.generators, logits.shape[0], logits.device)
    ops = _host_sampling_ops(logits)
    if ops is None:
        return inverse_cdf(_random_probs(logits, md), u)
    logits = logits.contiguous()
    cuts = md.top_k is not None or md.top_p is not None
    if md.min_p is not None and cuts:  # min_p's cut first, top-k / top-p on what it keeps
        scaled, lo = _restricted(logits, md)
        return ops.sample_rows(scaled.contiguous(), None, lo, u)
    lo = top_k_top_p_threshold(logits, md.top_k, md.top_p, md.temperature) if cuts else None
    log_min_p = None if md.min_p is None else torch.log(md.min_p)
    return ops.sample_rows(logits, md.temperature, lo, u, log_min_p)


def _host_sampling_ops(logits: torch.Tensor):
    """The C++ kernels for float32 CPU logits, None elsewhere or without them."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32:
        return None
    return cpu_ops.load()


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[B] the first token of each row of `probs` [B, V] (unnormalised is fine) whose
    cumulative probability, in float64, exceeds u [B] in [0, 1) times the row's total: a
    draw from the row's distribution; zero-probability tokens are never drawn."""
    cdf = probs.cumsum(dim=-1, dtype=torch.float64)
    ids = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    return ids.clamp_(max=probs.shape[-1] - 1)  # a NaN row: its check reports it


def step_uniforms(generator: torch.Generator | None, seeded: dict[int, torch.Generator],
                  rows: int, device: torch.device | str) -> torch.Tensor:
    """u [rows] float64 of one sampling step with a random row: `rows` numbers from
    `generator` (None: torch's default), then row i's from its own generator `seeded[i]`
    (multi-step decode draws its steps' numbers ahead with this, in this order)."""
    u = torch.rand(rows, generator=generator, dtype=torch.float64, device=device)
    for i, g in seeded.items():
        u[i] = uniform_draw(g, device)
    return u


def uniform_draw(generator: torch.Generator | None, device: torch.device | str) -> torch.Tensor:
    """The one number a random draw takes from `generator` (None: torch's default) per
    sampled token: a seeded request's verifier replays these for the tokens it emitted."""
    return torch.rand((), generator=generator, dtype=torch.float64, device=device)


def _restricted(logits: torch.Tensor, md: SamplingMetadata
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits / temperature with min_p's cut applied, each row's top-k / top-p threshold
    [B] in their dtype, None without top-k and top-p): a row keeps the values >= it."""
    logits = scaled_logits(logits, md.temperature)
    if md.min_p is not None:
        # p < min_p * p_max  <=>  logit < logit_max + log(min_p): no softmax needed.
        threshold = logits.amax(dim=-1, keepdim=True) + torch.log(md.min_p).unsqueeze(1)
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    if md.top_k is None and md.top_p is None:
        return logits, None
    return logits, top_k_top_p_threshold(logits, md.top_k, md.top_p)


def _random_probs(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    logits, lo = _restricted(logits, md)
    if lo is not None:
        logits = logits.masked_fill(logits < lo.unsqueeze(1), float("-inf"))
    return torch.softmax(logits, dim=-1)


def _gather_logprobs(raw: torch.Tensor, sampled: torch.Tensor, n: int) -> LogprobsTensors:
    sampled_logprobs = raw.gather(1, sampled.unsqueeze(1)).squeeze(1)
    # Rank counts every token at least as likely as the sampled one (vLLM convention).
    ranks = (raw >= sampled_logprobs.unsqueeze(1)).sum(dim=-1)
    topk_logprobs, topk_ids = raw.topk(n, dim=-1)
    return LogprobsTensors(sampled_logprobs, ranks, topk_ids, topk_logprobs)
