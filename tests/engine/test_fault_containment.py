"""A fault while handling one request's output fails only that request (blocks freed, the
others' tokens unchanged); a dead engine thread fails everything at once and accepts nothing.
Faults come from wrappers the tests install (tests/fault_injection.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from pagedllm import SamplingParams
from pagedllm.engine.async_engine import AsyncEngine, EngineDead, EngineRequest
from pagedllm.engine.llm_engine import LLMEngine
from tests.fault_injection import InjectedEngineDeath, install, parse

PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = {"a": "Hello there", "bad_out": "say FAULTOUT now", "b": "The capital of",
           "bad_nan": "FAULTNAN please"}


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    mp = pytest.MonkeyPatch()
    install(parse("output=FAULTOUT;logits=FAULTNAN;die=FAULTDIE"), mp.setattr)
    yield LLMEngine.from_engine_args(model=str(tiny_llama_dir), kv_cache_memory="4MiB",
                                     num_threads=1, max_model_len=256)
    mp.undo()


def _run(engine: LLMEngine, prompts: dict[str, str], params=PARAMS):
    for rid, prompt in prompts.items():
        engine.add_request(prompt, params, rid)
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
    return final


def test_a_fault_in_one_request_fails_only_that_request(engine) -> None:
    clean = _run(engine, {k: v for k, v in PROMPTS.items() if not k.startswith("bad")})
    got = _run(engine, PROMPTS)
    for rid in ("bad_out", "bad_nan"):
        assert got[rid].error is not None and got[rid].finished and got[rid].outputs == []
    assert "injected output-processing fault" in str(got["bad_out"].error)
    assert "not finite" in str(got["bad_nan"].error)
    for rid in ("a", "b"):
        assert got[rid].error is None
        assert got[rid].outputs[0].token_ids == clean[rid].outputs[0].token_ids
    assert engine.block_manager.usage == 0 and engine.get_num_unfinished_requests() == 0
    engine.check_invariants()


def test_a_fault_in_an_n_request_after_fan_out_frees_all_its_sequences(engine) -> None:
    got = _run(engine, {"bad": "FAULTOUT", "ok": "Hello"},
               SamplingParams(n=3, temperature=1.0, max_tokens=6, seed=1))
    assert got["bad"].error is not None and got["ok"].error is None
    assert len(got["ok"].outputs) == 3
    assert engine.block_manager.usage == 0
    engine.check_invariants()


def test_dead_engine_thread_fails_pending_and_new_requests_at_once(engine) -> None:
    async def main():
        a = AsyncEngine(engine)
        a.start()
        long = await a.add_requests([EngineRequest("long", "Hello", SamplingParams(
            temperature=0.0, max_tokens=200, ignore_eos=True))])
        outs = aiter(long)
        await anext(outs)  # it runs
        t0 = time.monotonic()
        await a.add_requests([EngineRequest("die", "FAULTDIE", PARAMS)])
        with pytest.raises(EngineDead):
            async for _ in outs:
                pass
        assert isinstance(await asyncio.wait_for(a.wait_dead(), 5), InjectedEngineDeath)
        assert time.monotonic() - t0 < 5
        assert isinstance(a.dead, InjectedEngineDeath)
        with pytest.raises(EngineDead):
            await a.add_requests([EngineRequest("late", "Hello", PARAMS)])
        a.stop(timeout=5)

    asyncio.run(main())
    # The thread is gone; the engine object itself is intact: clean it for the next test.
    engine.abort_request(["long", "die"])
    assert engine.block_manager.usage == 0
