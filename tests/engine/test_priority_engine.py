"""Priority scheduling through the engine (tiny model, deterministic: the test steps it):
a late high-priority request overtakes queued low-priority ones; a fcfs engine refuses a
priority instead of ignoring it."""

from __future__ import annotations

import pytest

from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.sampling_params import SamplingParams


def _engine(path, policy: str) -> LLMEngine:
    return LLMEngine.from_engine_args(model=str(path), kv_cache_memory="4MiB",
                                      max_model_len=256, max_num_seqs=1,
                                      scheduling_policy=policy)


def test_late_high_priority_request_overtakes_queued_ones(tiny_llama_dir):
    eng = _engine(tiny_llama_dir, "priority")
    params = SamplingParams(max_tokens=4, ignore_eos=True, temperature=0)
    eng.add_request([5, 6, 7], params.clone(), request_id="a", priority=5)
    eng.step()  # a runs; one sequence at a time
    for rid in ("b", "c"):
        eng.add_request([5, 6, 7], params.clone(), request_id=rid, priority=5)
    eng.add_request([5, 6, 7], params.clone(), request_id="d", priority=-1)  # the latest
    order = []
    for _ in range(100):
        order += [o.request_id for o in eng.step() if o.finished]
        if not eng.has_unfinished_requests():
            break
    assert order == ["a", "d", "b", "c"]
    eng.check_idle()


def test_fcfs_engine_refuses_a_priority(tiny_llama_dir):
    eng = _engine(tiny_llama_dir, "fcfs")
    with pytest.raises(ValueError, match="--scheduling-policy priority"):
        eng.add_request([5, 6], SamplingParams(max_tokens=2), request_id="x", priority=3)
    assert not eng.has_unfinished_requests()
