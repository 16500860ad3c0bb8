"""Prometheus metrics for the server, in the text exposition format (version 0.0.4).

A few dozen lines of exposition instead of a dependency on `prometheus_client`. Names follow
vLLM's with a `pagedllm:` prefix; every sample carries a `model_name` label.

Engine gauges and token counters are read from an `EngineSnapshot` that the engine thread
publishes after every step; per-request histograms are fed by `ServingMetrics.observe`, which
the async engine calls (on the event loop thread) for every output it hands to a request.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from dataclasses import dataclass

from pagedllm.outputs import RequestOutput

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


@dataclass(frozen=True)
class EngineSnapshot:
    """Engine state as of the end of its last step or command (published by the engine thread)."""

    running: int = 0  # requests (not sequences) in the running batch
    waiting: int = 0
    swapped: int = 0  # requests whose KV blocks are in the CPU swap pool
    kv_usage: float = 0.0  # fraction of KV blocks in use, 0.0 - 1.0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_preemptions_total: int = 0
    swapped_out_blocks_total: int = 0
    swapped_in_blocks_total: int = 0
    num_steps: int = 0
    prefix_cache_queries_total: int = 0  # tokens looked up in the prefix cache
    prefix_cache_hits_total: int = 0     # of those, tokens found there
    invariant_checks_total: int = 0      # idle-time block accounting checks
    invariant_violations_total: int = 0  # of those, failed (a bug: logged with details)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _num(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if isinstance(value, float) else str(value)


class Histogram:
    """Cumulative-bucket histogram (buckets are upper bounds; +Inf is implicit)."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = tuple(sorted(buckets))
        self.counts = [0] * (len(self.buckets) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def render(self, name: str, labels: dict[str, str]) -> list[str]:
        lines, acc = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            acc += n
            lines.append(f"{name}_bucket{_labels({**labels, 'le': _num(float(bound))})} {acc}")
        lines.append(f"{name}_sum{_labels(labels)} {_num(self.sum)}")
        lines.append(f"{name}_count{_labels(labels)} {acc}")
        return lines


class ServingMetrics:
    """Per-request latency histograms and finish counters; renders the whole /metrics page."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self._lock = threading.Lock()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_BUCKETS)
        self.queue = Histogram(REQUEST_BUCKETS)
        self.finished: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()  # reason -> API calls refused (429 / 413)
        self._last_token_time: dict[str, float] = {}

    def observe(self, out: RequestOutput, now: float) -> None:
        """Record one (possibly coalesced) output of a request, produced by a step ending at `now`."""
        new_tokens = any(c.delta_token_ids for c in out.outputs)
        with self._lock:
            if new_tokens:
                prev = self._last_token_time.get(out.request_id)
                m = out.metrics
                if prev is not None:
                    self.itl.observe(now - prev)
                elif m is not None and m.first_token_time is not None:
                    self.ttft.observe(m.first_token_time - m.arrival_time)
                    if m.first_scheduled_time is not None:
                        self.queue.observe(m.first_scheduled_time - m.arrival_time)
                self._last_token_time[out.request_id] = now
            if out.finished:
                self._last_token_time.pop(out.request_id, None)
                reason = next((c.finish_reason for c in out.outputs if c.finish_reason), "abort")
                self.finished[reason] += 1
                m = out.metrics
                if m is not None:
                    self.e2e.observe((m.finished_time or now) - m.arrival_time)

    def observe_abort(self, request_id: str, arrival_time: float, now: float) -> None:
        with self._lock:
            self._last_token_time.pop(request_id, None)
            self.finished["abort"] += 1
            self.e2e.observe(now - arrival_time)

    def observe_rejected(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] += 1

    def render(self, snap: EngineSnapshot) -> str:
        lab = {"model_name": self.model_name}
        out: list[str] = []

        def family(name: str, kind: str, doc: str, samples: list[str]) -> None:
            out.extend([f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *samples])

        def scalar(name: str, kind: str, doc: str, value: float) -> None:
            family(name, kind, doc, [f"{name}{_labels(lab)} {_num(value)}"])

        scalar("pagedllm:num_requests_running", "gauge",
               "Number of requests in the running batch.", snap.running)
        scalar("pagedllm:num_requests_waiting", "gauge",
               "Number of requests waiting to be scheduled.", snap.waiting)
        scalar("pagedllm:num_requests_swapped", "gauge",
               "Number of requests swapped out to CPU memory.", snap.swapped)
        scalar("pagedllm:kv_cache_usage_perc", "gauge",
               "Fraction of KV cache blocks in use (1 = 100%).", float(snap.kv_usage))
        scalar("pagedllm:prompt_tokens_total", "counter",
               "Prompt tokens of all accepted requests.", snap.prompt_tokens_total)
        scalar("pagedllm:generation_tokens_total", "counter",
               "Tokens generated.", snap.generation_tokens_total)
        scalar("pagedllm:num_preemptions_total", "counter",
               "Preemptions by the scheduler.", snap.num_preemptions_total)
        scalar("pagedllm:swapped_out_blocks_total", "counter",
               "KV blocks copied to CPU swap space by swap preemption.",
               snap.swapped_out_blocks_total)
        scalar("pagedllm:swapped_in_blocks_total", "counter",
               "KV blocks copied back from CPU swap space.", snap.swapped_in_blocks_total)
        scalar("pagedllm:prefix_cache_queries_total", "counter",
               "Prompt tokens looked up in the prefix cache.", snap.prefix_cache_queries_total)
        scalar("pagedllm:prefix_cache_hits_total", "counter",
               "Prompt tokens found in the prefix cache.", snap.prefix_cache_hits_total)
        scalar("pagedllm:invariant_checks_total", "counter",
               "Block-accounting checks run when the engine went idle.",
               snap.invariant_checks_total)
        scalar("pagedllm:invariant_violations_total", "counter",
               "Idle-time checks that found a violation (leaked or miscounted KV blocks).",
               snap.invariant_violations_total)
        with self._lock:
            reasons = dict(self.finished)
            rejected = dict(self.rejected)
            hists = [("pagedllm:time_to_first_token_seconds", "Time to first token.", self.ttft),
                     ("pagedllm:inter_token_latency_seconds", "Time between tokens.", self.itl),
                     ("pagedllm:e2e_request_latency_seconds", "Arrival to finish.", self.e2e),
                     ("pagedllm:request_queue_time_seconds", "Arrival to first scheduled.",
                      self.queue)]
            rendered = [(n, d, h.render(n, lab)) for n, d, h in hists]
        family("pagedllm:request_success_total", "counter", "Finished requests by reason.",
               [f"pagedllm:request_success_total{_labels({**lab, 'finished_reason': r})} {reasons.get(r, 0)}"
                for r in sorted({"stop", "length", "abort", *reasons})])
        family("pagedllm:request_rejected_total", "counter",
               "API calls refused before queueing, by reason (429: queue full; 413: body "
               "too large).",
               [f"pagedllm:request_rejected_total{_labels({**lab, 'reason': r})} "
                f"{rejected.get(r, 0)}"
                for r in sorted({"queued_reqs", "queued_tokens", "body_too_large", *rejected})])
        for name, doc, samples in rendered:
            family(name, "histogram", doc, samples)
        return "\n".join(out) + "\n"
