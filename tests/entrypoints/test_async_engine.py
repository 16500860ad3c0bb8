"""AsyncEngine in-process on a tiny model: coalescing for slow readers, abort frees blocks,
all-or-nothing adds, shutdown aborts in-flight requests."""

from __future__ import annotations

import asyncio
import time

import pytest

from pagedllm.engine.async_engine import (
    AsyncEngine,
    EngineRequest,
    EngineShuttingDown,
    RequestAborted,
)
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llm_engine(tiny_model_path) -> LLMEngine:
    return LLMEngine.from_engine_args(model=tiny_model_path, kv_cache_memory="4MiB")


def run(llm_engine: LLMEngine, body) -> None:
    """Run `body(async_engine)` on a fresh event loop with a started AsyncEngine."""
    async def main():
        engine = AsyncEngine(llm_engine)
        engine.start()
        try:
            await body(engine)
        finally:
            await asyncio.to_thread(engine.stop)
        assert not llm_engine.has_unfinished_requests()
        assert llm_engine.block_manager.usage == 0
        llm_engine.check_invariants()

    asyncio.run(main())


async def wait_until(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **kw)


def test_reader_that_falls_behind_gets_one_coalesced_output(llm_engine):
    async def body(engine: AsyncEngine):
        stream = await engine.add_requests([EngineRequest("slow", "Hello there", greedy(40))])
        # Do not read until the engine is done: it must not wait for us.
        await wait_until(lambda: stream.finished)
        assert engine.snapshot.running == 0 and engine.snapshot.kv_usage == 0
        items = [outs async for outs in stream]
        assert len(items) == 1 and len(items[0]) == 1
        c = items[0][0].outputs[0]
        assert items[0][0].finished and c.finish_reason == "length"
        assert c.delta_token_ids == c.token_ids and len(c.token_ids) == 40
        assert c.delta_text == c.text

    run(llm_engine, body)


def test_streamed_deltas_concatenate_to_the_text(llm_engine):
    async def body(engine: AsyncEngine):
        stream = await engine.add_requests(
            [EngineRequest("a", [5, 6, 7], greedy(12, n=2)), EngineRequest("b", "xy", greedy(5))])
        text: dict[tuple[str, int], str] = {}
        final = {}
        async for outs in stream:
            for out in outs:
                for c in out.outputs:
                    text[out.request_id, c.index] = text.get((out.request_id, c.index), "") \
                        + c.delta_text
                final[out.request_id] = out
        assert set(text) == {("a", 0), ("a", 1), ("b", 0)}
        for (rid, i), t in text.items():
            assert t == final[rid].outputs[i].text

    run(llm_engine, body)


def test_abort_frees_blocks(llm_engine):
    async def body(engine: AsyncEngine):
        stream = await engine.add_requests([EngineRequest("long", "go", greedy(900))])
        async for _ in stream:
            break
        assert engine.snapshot.kv_usage > 0
        stream.abort()
        await wait_until(lambda: engine.snapshot.running == 0 and engine.snapshot.kv_usage == 0)
        assert engine.metrics.finished["abort"] == 1

    run(llm_engine, body)


def test_invalid_request_queues_nothing(llm_engine):
    async def body(engine: AsyncEngine):
        with pytest.raises(ValueError, match="out of range"):
            await engine.add_requests([EngineRequest("ok", "fine", greedy(50)),
                                       EngineRequest("bad", [1, 10**6], greedy(5))])
        await asyncio.sleep(0.05)
        assert engine.snapshot.running == 0 and engine.snapshot.waiting == 0
        assert engine.snapshot.kv_usage == 0
        stream = await engine.add_requests([EngineRequest("after", "still works", greedy(3))])
        outs = [o async for o in stream]
        assert outs[-1][0].finished

    run(llm_engine, body)


def test_shutdown_aborts_in_flight_and_refuses_new(llm_engine):
    async def body(engine: AsyncEngine):
        stream = await engine.add_requests([EngineRequest("x", "go", greedy(900))])
        seen = 0
        with pytest.raises(RequestAborted):
            async for _ in stream:
                seen += 1
                if seen == 1:
                    engine.begin_shutdown()
        with pytest.raises(EngineShuttingDown):
            await engine.add_requests([EngineRequest("y", "go", greedy(2))])

    run(llm_engine, body)
