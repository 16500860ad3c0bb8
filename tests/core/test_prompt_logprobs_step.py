"""Prompt logprobs through the step's messages, with runner outputs made by hand (no model):
`update_from_output` keeps each chunk's ScoredPrompt on its request, a request still scoring
its prompt takes no prefix-cache hits (its blocks still enter the cache), and the output
processor reports the prompt logprobs once complete (DELTA: first output and final one)."""

from __future__ import annotations

import pytest

from pagedllm.core.block_manager import BlockManager
from pagedllm.core.request import PromptLogprobsOrderError, Request, RequestStatus
from pagedllm.core.runner_output import RunnerOutput, SampledTokens, ScoredPrompt
from pagedllm.core.scheduler import Scheduler
from pagedllm.core.scheduler_output import StepUpdate
from pagedllm.engine.output_processor import OutputProcessor
from pagedllm.outputs import Logprob, RequestOutputKind
from pagedllm.sampling_params import SamplingParams

BS = 4
PROMPT = list(range(10, 20))  # 10 tokens: 2 full blocks + 2


def make(budget: int = 64) -> tuple[Scheduler, BlockManager]:
    bm = BlockManager(32, BS, enable_caching=True)
    return Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=64), bm


def add(sched: Scheduler, rid: str, **params) -> Request:
    req = Request(rid, PROMPT, SamplingParams(max_tokens=2, **params), eos_token_id=None)
    sched.add_request(req)
    return req


def scored(req: Request, first: int, last: int) -> ScoredPrompt:
    """Positions first..last-1, each predicting the next prompt token."""
    return ScoredPrompt(
        req, first, [{PROMPT[p + 1]: Logprob(-0.1 * p, 1)} for p in range(first, last)]
    )


def test_chunks_accumulate_on_the_request() -> None:
    sched, bm = make(budget=4)
    req = add(sched, "a", prompt_logprobs=0)
    for first, last in ((0, 4), (4, 8)):
        out = sched.schedule()
        assert not out.scheduled[0].samples
        sched.update_from_output(out, RunnerOutput(prompt_logprobs=[scored(req, first, last)]))
        assert len(req.prompt_logprobs) == last + 1 and req.prompt_scoring_pending
    out = sched.schedule()  # positions 8, 9: 8 scores token 9, 9 samples
    sched.update_from_output(out, RunnerOutput([SampledTokens(req, [7])], [scored(req, 8, 9)]))
    assert not req.prompt_scoring_pending and req.prompt_logprobs[0] is None
    assert [next(iter(e)) for e in req.prompt_logprobs[1:]] == PROMPT[1:]
    with pytest.raises(PromptLogprobsOrderError):
        req.add_prompt_logprobs(3, [{1: Logprob(0.0)}])
    bm.check_invariants([req])


def test_no_cache_hits_while_scoring_but_blocks_are_cached() -> None:
    sched, bm = make()
    first = add(sched, "plain")
    out = sched.schedule()
    sched.update_from_output(out, RunnerOutput([SampledTokens(first, [7])]))
    sched.finish_requests([first], RequestStatus.FINISHED_LENGTH)  # its blocks stay cached
    scoring = add(sched, "scoring", prompt_logprobs=1)
    plain = add(sched, "plain-2")
    out = sched.schedule()
    assert {s.request.request_id: s.num_new_tokens for s in out.scheduled} == {
        "scoring": 10,
        "plain-2": 2,
    }
    assert scoring.num_cached_tokens == 0 and plain.num_cached_tokens == 8
    sched.update_from_output(
        out,
        RunnerOutput(
            [SampledTokens(scoring, [7]), SampledTokens(plain, [7])], [scored(scoring, 0, 9)]
        ),
    )
    assert scoring.num_cached_blocks == 2  # its full blocks are registered
    bm.check_invariants(sched.requests)


def test_output_processor_reports_them_once_complete(tiny_tokenizer) -> None:
    proc = OutputProcessor(tiny_tokenizer)
    req = Request("r", PROMPT, SamplingParams(max_tokens=3, prompt_logprobs=0), eos_token_id=None)
    proc.add(req)
    req.add_prompt_logprobs(0, scored(req, 0, 9).entries)
    outputs = []
    for tok in (40, 41, 42):
        req.append_token(tok)
        proc.process(StepUpdate(appended={req: 1}))
        if tok == 42:
            req.status = RequestStatus.FINISHED_LENGTH
        outputs.append(proc.make_output("r", kind=RequestOutputKind.DELTA))
    first, middle, final = (o.prompt_logprobs for o in outputs)
    assert first is not None and middle is None and final == first
    assert first[1][PROMPT[1]].decoded_token == tiny_tokenizer.decode([PROMPT[1]])


def test_a_coalescing_stream_keeps_the_prompt_logprobs() -> None:
    """A slow consumer gets a request's outputs folded into one (RequestStream.put): prompt
    logprobs carried by only some of them (DELTA) survive the fold in either order."""
    import asyncio

    from pagedllm.engine.request_stream import EngineRequest, RequestStream
    from pagedllm.outputs import CompletionOutput, RequestOutput

    entries = [None, {11: Logprob(-0.5, 1)}]

    def output(step: int, with_logprobs: bool) -> RequestOutput:
        c = CompletionOutput(0, "", [], delta_token_ids=[step])
        return RequestOutput(
            "r",
            None,
            [10, 11],
            [c],
            finished=step == 2,
            prompt_logprobs=entries if with_logprobs else None,
        )

    async def consume(order: list[bool]) -> list[RequestOutput]:
        stream = RequestStream(
            [EngineRequest("r", [10, 11], SamplingParams())], on_close=lambda *_: None
        )
        for step, flag in enumerate(order):
            stream.put(output(step, flag))
        return [o for outs in [x async for x in stream] for o in outs]

    for order in ([True, False, True], [False, False, True], [True, False, False]):
        (merged,) = asyncio.run(consume(order))
        assert merged.prompt_logprobs == entries
        assert merged.outputs[0].delta_token_ids == [0, 1, 2]
