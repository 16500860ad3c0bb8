"""The hand-written Prometheus exposition: names, types, cumulative buckets, escaping."""

from __future__ import annotations

from pagedllm.metrics import EngineSnapshot, Histogram, ServingMetrics
from pagedllm.outputs import CompletionOutput, RequestMetrics, RequestOutput


def _out(rid: str, n_new: int, finish: str | None, t0: float) -> RequestOutput:
    c = CompletionOutput(index=0, text="", token_ids=[1] * n_new, finish_reason=finish,
                         delta_token_ids=[1] * n_new)
    m = RequestMetrics(arrival_time=t0, first_scheduled_time=t0 + 0.01,
                       first_token_time=t0 + 0.05, finished_time=t0 + 1.0 if finish else None)
    return RequestOutput(rid, None, [1], [c], finished=finish is not None, metrics=m)


def test_histogram_buckets_are_cumulative():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 5.0):
        h.observe(v)
    lines = h.render("x", {"a": "b"})
    assert lines == ['x_bucket{a="b",le="0.1"} 2', 'x_bucket{a="b",le="1.0"} 3',
                     'x_bucket{a="b",le="+Inf"} 4', 'x_sum{a="b"} 5.65', 'x_count{a="b"} 4']


def test_render_names_and_request_latencies():
    m = ServingMetrics('weird "name"\\')
    m.observe(_out("r", 1, None, 100.0), now=100.05)
    m.observe(_out("r", 1, None, 100.0), now=100.10)
    m.observe(_out("r", 1, "length", 100.0), now=100.30)
    m.observe_abort("s", 100.0, now=101.0)
    text = m.render(EngineSnapshot(running=2, waiting=1, kv_usage=0.25, prompt_tokens_total=7,
                                   generation_tokens_total=9, num_preemptions_total=1))
    label = 'model_name="weird \\"name\\"\\\\"'
    for name, kind in [("num_requests_running", "gauge"), ("num_requests_waiting", "gauge"),
                       ("kv_cache_usage_perc", "gauge"), ("prompt_tokens_total", "counter"),
                       ("generation_tokens_total", "counter"),
                       ("num_preemptions_total", "counter"),
                       ("request_success_total", "counter"),
                       ("time_to_first_token_seconds", "histogram"),
                       ("inter_token_latency_seconds", "histogram"),
                       ("e2e_request_latency_seconds", "histogram"),
                       ("request_queue_time_seconds", "histogram")]:
        assert f"# TYPE pagedllm:{name} {kind}\n" in text
    assert f"pagedllm:kv_cache_usage_perc{{{label}}} 0.25\n" in text
    assert f"pagedllm:num_requests_waiting{{{label}}} 1\n" in text
    assert f'pagedllm:request_success_total{{{label},finished_reason="length"}} 1\n' in text
    assert f'pagedllm:request_success_total{{{label},finished_reason="abort"}} 1\n' in text
    assert f"pagedllm:time_to_first_token_seconds_count{{{label}}} 1\n" in text
    assert f"pagedllm:inter_token_latency_seconds_count{{{label}}} 2\n" in text
    assert f"pagedllm:e2e_request_latency_seconds_count{{{label}}} 2\n" in text
    assert text.endswith("\n")


def test_render_swap_gauge_and_counters():
    text = ServingMetrics("m").render(EngineSnapshot(swapped=3, swapped_out_blocks_total=40,
                                                     swapped_in_blocks_total=32))
    label = 'model_name="m"'
    assert "# TYPE pagedllm:num_requests_swapped gauge\n" in text
    assert "# TYPE pagedllm:swapped_out_blocks_total counter\n" in text
    assert f"pagedllm:num_requests_swapped{{{label}}} 3\n" in text
    assert f"pagedllm:swapped_out_blocks_total{{{label}}} 40\n" in text
    assert f"pagedllm:swapped_in_blocks_total{{{label}}} 32\n" in text
