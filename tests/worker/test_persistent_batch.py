"""PersistentBatch keeps block tables and penalty counts in step with the requests, whatever
happens to them between steps (appends, preemption resets, swaps, in-place block changes,
finishing), and matches what building them from the token lists gives."""

from __future__ import annotations

import random

import torch

from pagedllm import SamplingParams
from pagedllm.core.request import Request, RequestStatus
from pagedllm.model.layers.sampler import SamplingMetadata, SamplingRow
from pagedllm.worker.persistent_batch import PersistentBatch

VOCAB = 50


def req(rid: str, **params) -> Request:
    return Request(rid, [1, 2, 3, 7], SamplingParams(**params), eos_token_id=None)


def test_block_tables_follow_every_kind_of_change() -> None:
    rng = random.Random(0)
    batch = PersistentBatch(VOCAB, torch.device("cpu"), capacity=2, max_blocks=2)
    reqs = [req(f"r{i}") for i in range(5)]
    seen: dict[str, Request] = {}
    for step in range(300):
        for r in reqs:
            op = rng.random()
            if op < 0.5:
                r.block_ids.append(rng.randrange(1000))
            elif op < 0.55:
                r.block_ids = []  # preempted by recompute
            elif op < 0.6:
                r.block_ids = [rng.randrange(1000) for _ in r.block_ids]  # swapped back in
            elif op < 0.7 and r.block_ids:
                r.block_ids[rng.randrange(len(r.block_ids))] = rng.randrange(1000)  # CoW
        batch.begin_step()
        live = [r for r in reqs if r.block_ids]
        if not live:
            continue
        width = max(len(r.block_ids) for r in live)
        bt = batch.block_tables(live, width)
        seen.update((r.request_id, r) for r in live)
        for i, r in enumerate(live):
            assert bt[i, :len(r.block_ids)].tolist() == r.block_ids, step
        if step == 150:  # two finish: their rows are reused by newcomers
            for r in reqs[:2]:
                r.status = RequestStatus.FINISHED_ABORTED
            reqs = reqs[2:] + [req("n1"), req("n2")]
    batch.begin_step()
    assert len(batch) == sum(not r.is_finished for r in seen.values()) == 5


def test_penalty_counts_match_the_token_lists() -> None:
    rng = random.Random(1)
    batch = PersistentBatch(VOCAB, torch.device("cpu"))
    pen = [req(f"p{i}", repetition_penalty=1.2, frequency_penalty=0.5) for i in range(3)]
    plain = [req(f"q{i}") for i in range(2)]
    for step in range(40):
        for r in pen + plain:
            for _ in range(rng.choice([0, 1, 1, 2])):
                r.append_token(rng.randrange(VOCAB))
        if step == 20:  # one finishes, a newcomer with a long history takes a penalty row
            pen[0].status = RequestStatus.FINISHED_STOPPED
            late = req("late", presence_penalty=0.3)
            for _ in range(30):
                late.append_token(rng.randrange(VOCAB))
            pen = [*pen[1:], late]
        batch.begin_step()
        rows = [pen[0], plain[0], pen[1], pen[1], plain[1], pen[-1]]
        got = batch.penalty_tensors(rows)
        want = SamplingMetadata.build(
            [SamplingRow(r.sampling_params, r.prompt_token_ids, r.output_token_ids)
             for r in rows], VOCAB, "cpu")
        # Rows without a penalty are never read (their penalties are neutral).
        for i, r in enumerate(rows):
            if r in pen:
                assert torch.equal(got[0][i], want.output_counts[i].to(torch.int32)), step
                assert torch.equal(got[1][i], want.prompt_mask[i]), step
    assert batch.penalty_tensors(plain) is None
