"""Speculative decoding's /metrics series (vLLM's names, per-position counts, vLLM aliases),
`--speculative-config` on the command line, and the `--debug-steps` line."""

from __future__ import annotations

import argparse

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pagedllm import SamplingParams
from pagedllm.engine.metrics import ServingMetrics
from pagedllm.engine.stats import EngineStats
from pagedllm.entrypoints.args import add_engine_args, engine_config_from_args
from pagedllm.speculative.stats import SpeculativeStats


def _values(text: str) -> dict:
    return {(s.name, s.labels.get("position")): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_spec_series_exported_from_the_engine_stats():
    sd = SpeculativeStats(3)
    sd.record(3, 2)
    sd.record(3, 0)
    sd.record(2, 1)
    stats = EngineStats(speculative=sd)
    text = ServingMetrics("m", lambda: stats).render(vllm_compat=True)
    v = _values(text)
    assert v[("pagedllm:spec_decode_num_drafts_total", None)] == 3
    assert v[("pagedllm:spec_decode_num_draft_tokens_total", None)] == 8
    assert v[("pagedllm:spec_decode_num_accepted_tokens_total", None)] == 3
    per_pos = "pagedllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert [v[(per_pos, str(i))] for i in range(3)] == [2, 1, 0]
    assert v[("vllm:spec_decode_num_accepted_tokens_total", None)] == 3
    assert v[("vllm:spec_decode_num_accepted_tokens_per_pos_total", "0")] == 2
    assert sd.acceptance_rate == 3 / 8 and sd.mean_accepted_length == 2.0
    off = _values(ServingMetrics("m", lambda: EngineStats()).render())
    assert off[("pagedllm:spec_decode_num_drafts_total", None)] == 0


def test_speculative_config_flag():
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--speculative-config",
                              '{"method": "ngram", "num_speculative_tokens": 5}'])
    cfg = engine_config_from_args(args).speculative_config
    assert cfg.method == "ngram" and cfg.num_speculative_tokens == 5
    assert engine_config_from_args(parser.parse_args([])).speculative_config is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-config", '{"method": "eagle"}'])


def test_llm_kwarg_and_debug_line(tiny_llama_dir, make_llm, caplog):
    with pytest.raises(ValueError, match="preemption_mode='swap'"):
        make_llm(tiny_llama_dir, preemption_mode="swap", speculative_config={
            "method": "draft_model", "model": str(tiny_llama_dir)})
    llm = make_llm(tiny_llama_dir, speculative_config='{"method": "ngram", '
                   '"num_speculative_tokens": 2, "prompt_lookup_min": 1}')
    eng = llm.llm_engine
    eng.debug_steps = True
    caplog.set_level("INFO", logger="pagedllm.engine.llm_engine")
    llm.generate([[41] * 6], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                 use_tqdm=False)
    lines = [r.getMessage() for r in caplog.records if " drafts=" in r.getMessage()]
    assert lines and any("accepted_drafts=" in line and "accepted_drafts=0" not in line
                         for line in lines)
