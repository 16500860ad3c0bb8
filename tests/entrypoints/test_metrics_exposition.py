"""/metrics through prometheus_client: every series the README documents is present (parsed
with prometheus_client.parser), engine values are read from EngineStats at scrape time, request
latencies and finish reasons are observed, and --metrics-vllm-compat adds the vLLM names."""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from pagedllm.engine.metrics import SERIES, VLLM_ALIASES, ServingMetrics
from pagedllm.engine.stats import EngineStats
from pagedllm.outputs import CompletionOutput, RequestMetrics, RequestOutput

README = Path(__file__).resolve().parents[2] / "README.md"


def documented() -> dict[str, tuple[str, bool]]:
    """The README's metrics table: series -> (type, has a vLLM alias)."""
    rows = re.findall(r"^\| `(pagedllm:[a-z0-9_]+)` \| (\w+) \| .* \| (yes|no) \|$",
                      README.read_text(), re.M)
    return {name: (kind, vllm == "yes") for name, kind, vllm in rows}


def samples(text: str) -> dict[str, dict]:
    """{family name: {"type": ..., "samples": {(sample name, labels...): value}}}"""
    out = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = {"type": fam.type, "samples": {
            (s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples}}
    return out


def _out(rid: str, n_new: int, finish: str | None, t0: float) -> RequestOutput:
    c = CompletionOutput(index=0, text="", token_ids=[1] * n_new, finish_reason=finish,
                         delta_token_ids=[1] * n_new)
    m = RequestMetrics(arrival_time=t0, first_scheduled_time=t0 + 0.01,
                       first_token_time=t0 + 0.05, finished_time=t0 + 1.0 if finish else None)
    return RequestOutput(rid, None, [1], [c], finished=finish is not None, metrics=m)


def _family(series: str, kind: str) -> str:
    return series.removesuffix("_total") if kind == "counter" else series


def test_readme_documents_exactly_the_exported_series():
    docs = documented()
    assert docs, "README metrics table not found"
    assert {name: kind for name, (kind, _) in docs.items()} == SERIES
    assert {name for name, (_, vllm) in docs.items() if vllm} == set(VLLM_ALIASES)


def test_every_documented_series_is_present_and_typed():
    stats = EngineStats(prompt_tokens_total=7, generation_tokens_total=9,
                        num_preemptions_total=1, prefix_cache_queries=80, prefix_cache_hits=32)
    stats.set_gauges(running=2, waiting=1, swapped=3, kv_usage=0.25)
    m = ServingMetrics('weird "name"\\', lambda: stats)
    m.observe(_out("r", 1, None, 100.0), now=100.05)
    m.observe(_out("r", 1, None, 100.0), now=100.10)
    m.observe(_out("r", 1, "length", 100.0), now=100.30)
    m.observe_abort("s", 100.0, now=101.0)
    fams = samples(m.render())
    for series, (kind, _) in documented().items():
        fam = fams[_family(series, kind)]
        assert fam["type"] == kind, series
    label = (("model_name", 'weird "name"\\'),)

    def value(name: str, extra: tuple = ()) -> float:
        fam_name = name.removesuffix("_total").removesuffix("_count")
        return fams[fam_name]["samples"][(name, tuple(sorted(label + extra)))]

    assert value("pagedllm:kv_cache_usage_perc") == 0.25
    assert value("pagedllm:num_requests_waiting") == 1
    assert value("pagedllm:num_requests_swapped") == 3
    assert value("pagedllm:prompt_tokens_total") == 7
    assert value("pagedllm:prefix_cache_hits_total") == 32
    assert value("pagedllm:request_success_total", (("finished_reason", "length"),)) == 1
    assert value("pagedllm:request_success_total", (("finished_reason", "abort"),)) == 1
    assert value("pagedllm:request_success_total", (("finished_reason", "stop"),)) == 0
    hist = fams["pagedllm:inter_token_latency_seconds"]["samples"]
    assert hist[("pagedllm:inter_token_latency_seconds_count", label)] == 2
    assert fams["pagedllm:time_to_first_token_seconds"]["samples"][
        ("pagedllm:time_to_first_token_seconds_count", label)] == 1
    assert fams["pagedllm:e2e_request_latency_seconds"]["samples"][
        ("pagedllm:e2e_request_latency_seconds_count", label)] == 2
    # Buckets are cumulative and end in +Inf = count.
    buckets = [v for (name, _), v in hist.items() if name.endswith("_bucket")]
    assert buckets == sorted(buckets) and buckets[-1] == 2
    assert not any("_created" in name for name in fams)  # vLLM has no *_created series


def test_engine_values_are_read_at_scrape_time():
    stats = EngineStats()
    m = ServingMetrics("m", lambda: stats)
    assert 'pagedllm:generation_tokens_total{model_name="m"} 0.0' in m.render()
    stats.generation_tokens_total = 41
    stats.set_gauges(running=0, waiting=0, swapped=0, kv_usage=0.5)
    text = m.render()
    assert 'pagedllm:generation_tokens_total{model_name="m"} 41.0' in text
    assert 'pagedllm:kv_cache_usage_perc{model_name="m"} 0.5' in text


def test_vllm_compat_aliases():
    stats = EngineStats(generation_tokens_total=5)
    stats.set_gauges(running=1, waiting=0, swapped=0, kv_usage=0.125)
    m = ServingMetrics("m", lambda: stats)
    m.observe(_out("r", 1, "stop", 10.0), now=10.1)
    plain = samples(m.render())
    assert not any(name.startswith("vllm:") for name in plain)
    fams = samples(m.render(vllm_compat=True))
    for series, aliases in VLLM_ALIASES.items():
        kind = SERIES[series]
        for alias in aliases:
            fam = fams[_family(alias, kind)]
            assert fam["type"] == kind
            original = plain[_family(series, kind)]["samples"]
            renamed = {(name.replace(_family(series, kind), _family(alias, kind)), labels): v
                       for (name, labels), v in original.items()}
            assert fam["samples"] == renamed, alias
    lab = (("model_name", "m"),)
    assert fams["vllm:gpu_cache_usage_perc"]["samples"][("vllm:gpu_cache_usage_perc", lab)] \
        == 0.125
    assert fams["vllm:generation_tokens"]["samples"][("vllm:generation_tokens_total", lab)] == 5
    assert ("vllm:request_success_total", (("finished_reason", "stop"), ("model_name", "m"))) \
        in fams["vllm:request_success"]["samples"]
    assert "vllm:swapped_out_blocks" not in fams  # no vLLM counterpart
