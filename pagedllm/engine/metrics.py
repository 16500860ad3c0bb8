"""Prometheus metrics for the server, through `prometheus_client`.

Names follow vLLM's with a `pagedllm:` prefix; every sample carries a `model_name` label.
Two sources, one registry per server:

    EngineCollector   engine gauges and token counters, read from the engine's `EngineStats`
                      at scrape time (the engine thread keeps them current; nothing is copied)
    ServingMetrics    per-request histograms and finish counters, fed by `observe` (the async
                      engine calls it on the event loop for every output it hands a request)

`render(vllm_compat=True)` (`pagedllm serve --metrics-vllm-compat`) adds every series that has a
vLLM counterpart again under vLLM's name (`vllm:num_requests_running`, ...), so dashboards
built for vLLM work unchanged. `SERIES` lists what is exported (README documents it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pagedllm.engine.stats import EngineStats
from pagedllm.outputs import RequestOutput

CONTENT_TYPE = CONTENT_TYPE_LATEST
# No `*_created` series: vLLM has none and they double the page for nothing.
disable_created_metrics()

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# Engine series: (name without prefix, type, help, EngineStats attribute).
_ENGINE = [
    ("num_requests_running", "gauge", "Number of requests in the running batch.", "running"),
    ("num_requests_waiting", "gauge", "Number of requests waiting to be scheduled.", "waiting"),
    ("num_requests_swapped", "gauge", "Number of requests swapped out to CPU memory.",
     "swapped"),
    ("kv_cache_usage_perc", "gauge", "Fraction of KV cache blocks in use (1 = 100%).",
     "kv_usage"),
    ("prompt_tokens_total", "counter", "Prompt tokens of all accepted requests.",
     "prompt_tokens_total"),
    ("generation_tokens_total", "counter", "Tokens generated.", "generation_tokens_total"),
    ("num_preemptions_total", "counter", "Preemptions by the scheduler.",
     "num_preemptions_total"),
    ("swapped_out_blocks_total", "counter",
     "KV blocks copied to CPU swap space by swap preemption.", "swapped_out_blocks_total"),
    ("swapped_in_blocks_total", "counter", "KV blocks copied back from CPU swap space.",
     "swapped_in_blocks_total"),
    ("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
     "prefix_cache_queries"),
    ("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
     "prefix_cache_hits"),
    ("invariant_checks_total", "counter",
     "Block-accounting checks run when the engine went idle.", "invariant_checks_total"),
    ("invariant_violations_total", "counter",
     "Idle-time checks that found a violation (leaked or miscounted KV blocks).",
     "invariant_violations_total"),
]
_HISTOGRAMS = [
    ("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS),
    ("inter_token_latency_seconds", "Time between tokens.", ITL_BUCKETS),
    ("e2e_request_latency_seconds", "Arrival to finish.", REQUEST_BUCKETS),
    ("request_queue_time_seconds", "Arrival to first scheduled.", REQUEST_BUCKETS),
]
# Speculative decoding (vLLM's names), from EngineStats.speculative (zero while it is off).
_SPEC = [
    ("spec_decode_num_drafts_total", "Verifications of draft tokens (one per speculating "
     "request per step).", "num_drafts"),
    ("spec_decode_num_draft_tokens_total", "Draft tokens verified.", "num_draft_tokens"),
    ("spec_decode_num_accepted_tokens_total", "Draft tokens accepted.",
     "num_accepted_tokens"),
]
SPEC_PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"
FINISH_REASONS = ("stop", "length", "abort")
REJECT_REASONS = ("queued_reqs", "queued_tokens", "body_too_large")

# Every exported series: full name -> Prometheus type.
SERIES: dict[str, str] = {
    **{f"pagedllm:{name}": kind for name, kind, _, _ in _ENGINE},
    **{f"pagedllm:{name}": "counter" for name, _, _ in _SPEC},
    f"pagedllm:{SPEC_PER_POS}": "counter",
    "pagedllm:request_success_total": "counter",
    "pagedllm:request_rejected_total": "counter",
    **{f"pagedllm:{name}": "histogram" for name, _, _ in _HISTOGRAMS},
}
_PAGEDLLM_ONLY = {"pagedllm:swapped_out_blocks_total", "pagedllm:swapped_in_blocks_total",
                  "pagedllm:invariant_checks_total", "pagedllm:invariant_violations_total",
                  "pagedllm:request_rejected_total"}
# --metrics-vllm-compat: vLLM name(s) for each pagedllm series that has a counterpart
# (gpu_cache_usage_perc and time_per_output_token_seconds are vLLM's older names).
VLLM_ALIASES: dict[str, tuple[str, ...]] = {
    **{name: (name.replace("pagedllm:", "vllm:"),) for name in SERIES
       if name not in _PAGEDLLM_ONLY},
    "pagedllm:kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "pagedllm:inter_token_latency_seconds": ("vllm:inter_token_latency_seconds",
                                             "vllm:time_per_output_token_seconds"),
}


def _family_name(series: str, kind: str) -> str:
    """prometheus_client names a counter family without its `_total` suffix."""
    return series.removesuffix("_total") if kind == "counter" else series


class EngineCollector(Collector):
    """Engine gauges and counters, read from `stats()` when /metrics is scraped."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self.model_name, self.stats = model_name, stats

    def collect(self) -> Iterator[Metric]:
        st = self.stats()
        for name, kind, doc, attr in _ENGINE:
            cls = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
            family = cls(f"pagedllm:{name}", doc, labels=["model_name"])
            family.add_metric([self.model_name], float(getattr(st, attr)))
            yield family


class SpecDecodeCollector(Collector):
    """Speculative decoding's counters (zero while it is off) and the accepted tokens per
    draft position (label `position`, 0-based; only position 0 while it is off)."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self.model_name, self.stats = model_name, stats

    def collect(self) -> Iterator[Metric]:
        sd = self.stats().speculative
        for name, doc, attr in _SPEC:
            family = CounterMetricFamily(f"pagedllm:{name}", doc, labels=["model_name"])
            family.add_metric([self.model_name], float(getattr(sd, attr) if sd else 0))
            yield family
        per_pos = CounterMetricFamily(f"pagedllm:{SPEC_PER_POS}",
                                      "Draft tokens accepted, by position in the draft.",
                                      labels=["model_name", "position"])
        # Off: one zero sample (position 0), so the series exists for dashboards.
        for pos, count in enumerate(sd.accepted_per_pos if sd else (0,)):
            per_pos.add_metric([self.model_name, str(pos)], float(count))
        yield per_pos


class LoRACollector(Collector):
    """vLLM's `lora_requests_info` (adapter names in labels, value = scrape time) and the
    running / waiting requests per adapter; nothing when LoRA is off (`max_lora` 0)."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self.model_name, self.stats = model_name, stats

    def collect(self) -> Iterator[Metric]:
        import time

        st = self.stats()
        if not st.max_lora:
            return
        info = GaugeMetricFamily(
            "pagedllm:lora_requests_info", "Running and waiting LoRA adapters.",
            labels=["model_name", "max_lora", "running_lora_adapters", "waiting_lora_adapters"])
        info.add_metric([self.model_name, str(st.max_lora),
                         ",".join(n for n, _ in st.lora_running),
                         ",".join(n for n, _ in st.lora_waiting)], time.time())
        yield info
        for name, pairs, doc in (("running", st.lora_running, "in the running batch"),
                                 ("waiting", st.lora_waiting, "waiting to be scheduled")):
            family = GaugeMetricFamily(f"pagedllm:lora_num_requests_{name}",
                                       f"Requests {doc} per LoRA adapter.",
                                       labels=["model_name", "lora_name"])
            for adapter, count in pairs:
                family.add_metric([self.model_name, adapter], float(count))
            yield family


class _VllmAliases(Collector):
    """The series of `source` that vLLM also has, again under vLLM's names."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source
        self._families = {_family_name(s, k): s for s, k in SERIES.items()}

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            series = self._families.get(family.name)
            for alias in VLLM_ALIASES.get(series, ()):
                kind = SERIES[series]
                renamed = Metric(_family_name(alias, kind), family.documentation, family.type)
                old, new = _family_name(series, kind), _family_name(alias, kind)
                renamed.samples = [s._replace(name=new + s.name[len(old):])
                                   for s in family.samples]
                yield renamed


class ServingMetrics:
    """The /metrics page of one server: engine series plus per-request latency histograms
    and finish counters."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats] | None = None) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        if stats is not None:
            self.registry.register(EngineCollector(model_name, stats))
            self.registry.register(LoRACollector(model_name, stats))
            self.registry.register(SpecDecodeCollector(model_name, stats))
        self._aliases = CollectorRegistry(auto_describe=False)
        self._aliases.register(_VllmAliases(self.registry))
        self._success = Counter("pagedllm:request_success", "Finished requests by reason.",
                                ["model_name", "finished_reason"], registry=self.registry)
        self._reasons = set(FINISH_REASONS)
        for reason in FINISH_REASONS:
            self._success.labels(model_name, reason)
        self._rejected = Counter(
            "pagedllm:request_rejected", "API calls refused before queueing, by reason (429: "
            "queue full; 413: body too large).", ["model_name", "reason"],
            registry=self.registry)
        for reason in REJECT_REASONS:
            self._rejected.labels(model_name, reason)
        hist = {name: Histogram(f"pagedllm:{name}", doc, ["model_name"], buckets=buckets,
                                registry=self.registry).labels(model_name)
                for name, doc, buckets in _HISTOGRAMS}
        self.ttft = hist["time_to_first_token_seconds"]
        self.itl = hist["inter_token_latency_seconds"]
        self.e2e = hist["e2e_request_latency_seconds"]
        self.queue = hist["request_queue_time_seconds"]
        # Event loop thread only (observe / observe_abort), so no lock.
        self._last_token_time: dict[str, float] = {}

    def observe(self, out: RequestOutput, now: float) -> None:
        """Record one (possibly coalesced) output of a request, produced by a step ending at `now`."""
        if not isinstance(out, RequestOutput):  # a pooling result: one final output
            self._reasons.add("stop")
            self._success.labels(self.model_name, "stop").inc()
            return
        m = out.metrics
        if any(c.delta_token_ids for c in out.outputs):
            prev = self._last_token_time.get(out.request_id)
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
            self._reasons.add(reason)
            self._success.labels(self.model_name, reason).inc()
            if m is not None:
                self.e2e.observe((m.finished_time or now) - m.arrival_time)

    def observe_rejected(self, reason: str) -> None:
        """An API call refused before it reached the engine (queue full, body too large)."""
        self._rejected.labels(self.model_name, reason).inc()

    def observe_abort(self, request_id: str, arrival_time: float, now: float) -> None:
        self._last_token_time.pop(request_id, None)
        self._success.labels(self.model_name, "abort").inc()
        self.e2e.observe(now - arrival_time)

    @property
    def finished(self) -> dict[str, int]:
        """Finished requests by reason so far (what request_success_total exports)."""
        return {r: int(self.registry.get_sample_value(
            "pagedllm:request_success_total",
            {"model_name": self.model_name, "finished_reason": r}) or 0) for r in self._reasons}

    def render(self, vllm_compat: bool = False) -> str:
        """The exposition text (Prometheus text format)."""
        text = generate_latest(self.registry).decode()
        if vllm_compat:
            text += generate_latest(self._aliases).decode()
        return text
