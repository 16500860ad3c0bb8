"""Engine counters, gauges and per-step timings (read by /metrics and --debug-steps).

The engine thread writes them; /metrics reads them from the event loop thread at scrape time
(single attribute reads, so a scrape may mix values of two neighbouring steps, never torn ones).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from pagedllm.speculative.stats import SpeculativeStats


@dataclass
class StepRecord:
    step: int
    prefill_tokens: int
    decode_seqs: int
    preempted: int
    kv_usage: float
    running: int  # requests (an n > 1 request once), as the gauges
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
    # Gauges as of the last step or request change (LLMEngine keeps them current).
    running: int = 0   # requests (not sequences) in the running batch
    waiting: int = 0
    swapped: int = 0   # requests whose KV blocks are in the CPU swap pool
    kv_usage: float = 0.0  # fraction of KV blocks in use, 0.0 - 1.0
    # LoRA (max_lora 0: off): (adapter name, requests) in the running and waiting queues.
    max_lora: int = 0
    lora_running: tuple[tuple[str, int], ...] = ()
    lora_waiting: tuple[tuple[str, int], ...] = ()
    speculative: SpeculativeStats | None = None  # speculative decoding's counters (None: off)

    def cleared(self) -> EngineStats:
        """Fresh counters and gauges that keep what describes the engine (max_lora), e.g.
        after the warm-up pass, so /metrics starts at zero."""
        return EngineStats(max_lora=self.max_lora, speculative=self.speculative
                           and self.speculative.cleared())

    def observe_queues(self, scheduler, block_manager) -> None:
        """Set the gauges from the scheduler's queues and the block pool. Queue gauges count
        requests (an n > 1 request's sequences count once per queue they are in), as the
        metric names say."""
        def num_requests(queue) -> int:
            return len({r.group_id for r in queue})

        # The waiting queue counts its groups as it changes (it can hold 20,000 requests).
        self.set_gauges(num_requests(scheduler.running), scheduler.waiting.num_groups,
                        num_requests(scheduler.swapped), block_manager.usage)
        if self.max_lora:
            self.lora_running = requests_per_adapter(scheduler.running)
            self.lora_waiting = requests_per_adapter(scheduler.waiting)

    def set_gauges(self, running: int, waiting: int, swapped: int, kv_usage: float) -> None:
        self.running, self.waiting, self.swapped, self.kv_usage = (
            running, waiting, swapped, kv_usage)

    def on_add(self, num_prompt_tokens: int) -> None:
        self.prompt_tokens_total += num_prompt_tokens

    def on_finish(self, reason: str) -> None:
        """One count per request (an n > 1 request counts once, with its first sample's
        reason), as the server's request_success_total counts."""
        self.finished[reason] += 1

    def on_step(self, sched, result, num_generated: int, timings_ms: dict[str, float]) -> None:
        """Count one step: `sched` and `result` are its SchedulerOutput and RunnerOutput,
        `num_generated` the tokens the requests kept. The step record takes the queue and
        KV gauges as `observe_queues` set them after the step (the engine calls it first)."""
        self.num_steps += 1
        decodes = sum(1 for s in sched.scheduled
                      if s.num_new_tokens - s.num_draft_tokens == 1)
        self.generation_tokens_total += num_generated
        if self.speculative is not None:
            self.speculative.begin_step()
            for st in result.sampled:
                if st.num_drafts:
                    self.speculative.record(st.num_drafts, st.num_accepted)
        self.num_preemptions_total += len(sched.preempted)
        self.swapped_out_blocks_total += len(sched.blocks_to_swap_out)
        self.swapped_in_blocks_total += len(sched.blocks_to_swap_in)
        self.prefix_cache_queries += sched.prefix_cache_queries
        self.prefix_cache_hits += sched.prefix_cache_hits
        self.last = StepRecord(
            step=self.num_steps, prefill_tokens=sched.num_batched_tokens - decodes,
            decode_seqs=decodes, preempted=len(sched.preempted), kv_usage=self.kv_usage,
            running=self.running, waiting=self.waiting, timings_ms=timings_ms,
            swapped=self.swapped,
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
                f"prefix_cache_hit_rate={100 * self.prefix_cache_hit_rate:.1f}%"
                + (f" {self.speculative.step_line()}" if self.speculative else ""))


def requests_per_adapter(queue) -> tuple[tuple[str, int], ...]:
    """(LoRA adapter name, number of requests) for the requests of `queue` with an adapter."""
    groups = {(r.lora.name, r.group_id) for r in queue if r.lora is not None}
    return tuple(sorted(Counter(name for name, _ in groups).items()))
