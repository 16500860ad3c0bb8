"""Engine counters and per-step timings (read by the metrics endpoint and --debug-steps)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pagedllm.metrics import EngineSnapshot

if TYPE_CHECKING:
    from pagedllm.engine.llm_engine import LLMEngine


@dataclass
class StepRecord:
    step: int
    prefill_tokens: int
    decode_seqs: int
    preempted: int
    kv_usage: float
    running: int
    waiting: int
    timings_ms: dict[str, float]
    swapped: int = 0          # requests in the swap pool after the step
    swap_out_blocks: int = 0  # blocks copied device -> CPU this step
    swap_in_blocks: int = 0   # blocks copied CPU -> device this step


@dataclass
class EngineStats:
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_preemptions_total: int = 0
    # Swap preemption: blocks copied to the CPU swap pool and back.
    swapped_out_blocks_total: int = 0
    swapped_in_blocks_total: int = 0
    # Prefix caching, in tokens: the tokens of every admitted request (resumptions after a
    # preemption included), and how many of them were found in the cache.
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_steps: int = 0
    # Block-accounting checks the server runs whenever the engine goes idle, and failures.
    invariant_checks_total: int = 0
    invariant_violations_total: int = 0
    finished: Counter = field(default_factory=Counter)
    last: StepRecord | None = None

    def on_add(self, num_prompt_tokens: int) -> None:
        self.prompt_tokens_total += num_prompt_tokens

    def on_finish(self, reason: str) -> None:
        """One count per request (an n > 1 request counts once, with its first sample's
        reason), as the server's request_success_total counts."""
        self.finished[reason] += 1

    def on_step(self, sched, result, kv_usage: float, running: int, waiting: int,
                timings_ms: dict[str, float], outputs, swapped: int = 0) -> None:
        self.num_steps += 1
        decodes = sum(1 for s in sched.scheduled if s.num_new_tokens == 1)
        self.generation_tokens_total += sum(len(s.token_ids) for s in result.sampled)
        self.num_preemptions_total += len(sched.preempted)
        self.swapped_out_blocks_total += len(sched.blocks_to_swap_out)
        self.swapped_in_blocks_total += len(sched.blocks_to_swap_in)
        self.prefix_cache_queries += sched.prefix_cache_queries
        self.prefix_cache_hits += sched.prefix_cache_hits
        self.last = StepRecord(
            step=self.num_steps, prefill_tokens=sched.num_batched_tokens - decodes,
            decode_seqs=decodes, preempted=len(sched.preempted), kv_usage=kv_usage,
            running=running, waiting=waiting, timings_ms=timings_ms, swapped=swapped,
            swap_out_blocks=len(sched.blocks_to_swap_out),
            swap_in_blocks=len(sched.blocks_to_swap_in))

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Fraction of queried tokens found in the prefix cache so far (0.0 before any)."""
        queries = self.prefix_cache_queries
        return self.prefix_cache_hits / queries if queries else 0.0

    def step_line(self) -> str:
        r = self.last
        if r is None:
            return "no step yet"
        t = " ".join(f"{k}={v:.1f}ms" for k, v in r.timings_ms.items())
        return (f"step {r.step}: prefill_tokens={r.prefill_tokens} decode_seqs={r.decode_seqs} "
                f"running={r.running} waiting={r.waiting} swapped={r.swapped} "
                f"preempted={r.preempted} swap_out_blocks={r.swap_out_blocks} "
                f"swap_in_blocks={r.swap_in_blocks} {t} "
                f"kv_usage={100 * r.kv_usage:.1f}% "
                f"prefix_cache_hit_rate={100 * self.prefix_cache_hit_rate:.1f}%")


def snapshot_of(eng: LLMEngine) -> EngineSnapshot:
    """The engine's gauges and counters; queue gauges count requests (an n > 1 request's
    sequences count once per queue they are in), as the metric names say."""
    st, sched = eng.stats, eng.scheduler

    def num_requests(queue) -> int:
        return len({r.group_id for r in queue})

    return EngineSnapshot(
        running=num_requests(sched.running), waiting=num_requests(sched.waiting),
        swapped=num_requests(sched.swapped), kv_usage=eng.block_manager.usage,
        prompt_tokens_total=st.prompt_tokens_total,
        generation_tokens_total=st.generation_tokens_total,
        num_preemptions_total=st.num_preemptions_total,
        swapped_out_blocks_total=st.swapped_out_blocks_total,
        swapped_in_blocks_total=st.swapped_in_blocks_total, num_steps=st.num_steps,
        prefix_cache_queries_total=st.prefix_cache_queries,
        prefix_cache_hits_total=st.prefix_cache_hits,
        invariant_checks_total=st.invariant_checks_total,
        invariant_violations_total=st.invariant_violations_total)
