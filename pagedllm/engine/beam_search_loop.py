"""`LLM.beam_search`: the step loop of an offline beam search (algorithm: pagedllm/beam_search.py).

Each step submits every live beam of every prompt as one request (its tokens as the prompt,
one greedy token, the top 2 * beam_width logprobs) and runs them as one batch. KV sharing
between beams goes through the prefix cache: a beam's request hits the full blocks its
ancestors computed, one block-manager reference per beam holding a block, so a step computes
only each beam's last, partly filled block (vLLM v1's design; it needs no fork of running
sequences in the scheduler and survives preemption). Without prefix caching every step
recomputes whole beams: correct, but slow (logged once).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from pagedllm.beam_search import (
    BeamSearchInstance,
    BeamSearchOutput,
    BeamSearchParams,
    InvalidBeamSearchParams,
)
from pagedllm.lora.request import LoRARequest
from pagedllm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedllm.engine.llm import LLM, Prompt

logger = logging.getLogger(__name__)


def step_params(params: BeamSearchParams, logprobs: int | None = None) -> SamplingParams:
    """The SamplingParams of one beam's step request: one token, the candidates' logprobs
    (`logprobs` when a caller wants more of them returned). The sampled token is unused."""
    return SamplingParams(
        temperature=0.0,
        max_tokens=1,
        ignore_eos=True,
        logprobs=max(params.num_candidates, logprobs or 0),
    )


def check_beam_width(params: BeamSearchParams, max_logprobs: int) -> None:
    """Each step asks for 2 * beam_width logprobs, bounded by the engine's max_logprobs."""
    if params.num_candidates > max_logprobs:
        raise InvalidBeamSearchParams(
            f"beam_width {params.beam_width} needs {params.num_candidates} logprobs per step; "
            f"max_logprobs is {max_logprobs} (--max-logprobs), so beam_width must be <= "
            f"{max_logprobs // 2}"
        )


def run_beam_search(
    llm: LLM,
    prompts: list[Prompt],
    params: BeamSearchParams,
    *,
    use_tqdm: bool = False,
    lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
) -> list[BeamSearchOutput]:
    """One BeamSearchOutput per prompt, in input order; invalid input raises ValueError
    before anything runs."""
    engine = llm.llm_engine
    if not isinstance(params, BeamSearchParams):
        raise InvalidBeamSearchParams(f"params must be a BeamSearchParams, got {params!r}")
    check_beam_width(params, engine.config.max_logprobs)
    loras = (
        list(lora_request) if isinstance(lora_request, Sequence) else [lora_request] * len(prompts)
    )
    if len(loras) != len(prompts):
        raise ValueError(f"got {len(loras)} lora_requests for {len(prompts)} prompts")
    limit = engine.config.max_model_len
    instances, salts = [], []
    for prompt in prompts:
        _, ids = engine.intake.tokenize_prompt(prompt)
        engine.intake.validate_prompt(ids)
        if len(ids) + params.max_tokens > limit:
            raise ValueError(
                f"prompt has {len(ids)} tokens and max_tokens is "
                f"{params.max_tokens}: {len(ids) + params.max_tokens} > "
                f"max_model_len {limit}"
            )
        instances.append(BeamSearchInstance(ids, params, engine.eos_token_id))
        salts.append(prompt.get("cache_salt") if isinstance(prompt, dict) else None)
    if not engine.block_manager.enable_caching:
        logger.warning("beam search without prefix caching recomputes every beam each step")
    sampling = step_params(params)
    bar = tqdm(total=params.max_tokens, desc="Beam search", disable=not use_tqdm)
    try:
        while live := [i for i, inst in enumerate(instances) if not inst.done]:
            batch = [
                (i, {"prompt_token_ids": beam.tokens, "cache_salt": salts[i]})
                for i in live
                for beam in instances[i].beams
            ]
            outs = llm.generate(
                [p for _, p in batch],
                sampling,
                use_tqdm=False,
                lora_request=[loras[i] for i, _ in batch],
            )
            rows: dict[int, list] = {i: [] for i in live}
            for (i, _), out in zip(batch, outs, strict=True):
                rows[i].append(out.outputs[0].logprobs[0])
            for i in live:
                instances[i].advance(rows[i])
            bar.update(1)
    finally:
        bar.close()
    tokenizer = engine.tokenizer
    results = [inst.output() for inst in instances]
    for res in results:
        for seq in res.sequences:
            seq.text = tokenizer.decode(seq.tokens)  # prompt included, as vLLM's
    return results
