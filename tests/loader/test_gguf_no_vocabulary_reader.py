"""Later starts of a GGUF model read the file without its vocabulary arrays (the tokenizer
comes from the conversion cache): the same tensors and scalar metadata as gguf-py's reader,
far faster (Gemma 3's 262k-entry vocabulary took 20-35 s to parse on 2 cores)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pagedllm.loader import gguf_loader, gguf_reader
from pagedllm.loader.checkpoint import load_checkpoint


def test_same_tensors_and_scalar_metadata_without_the_vocabulary(smollm2_gguf: Path):
    t0 = time.perf_counter()
    fast = gguf_loader.open_gguf(smollm2_gguf, vocabulary=False)
    t_fast = time.perf_counter() - t0
    t0 = time.perf_counter()
    full = gguf_loader.open_gguf(smollm2_gguf)
    t_full = time.perf_counter() - t0

    def tensors(reader):
        return [(t.name, t.tensor_type, list(t.shape), t.data_offset, t.data.shape)
                for t in reader.tensors]

    assert tensors(fast) == tensors(full)
    assert set(full.fields) - set(fast.fields) == {
        "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"}
    for key, field in fast.fields.items():
        assert field.contents() == full.fields[key].contents(), key
    assert gguf_loader.gguf_config(fast).to_dict() == gguf_loader.gguf_config(full).to_dict()
    assert t_fast < t_full / 5, (t_fast, t_full)


def test_cached_quantized_start_never_parses_the_vocabulary(smollm2_gguf: Path, tmp_path,
                                                            monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="pagedllm.loader.gguf_loader")
    first = load_checkpoint(str(smollm2_gguf), cache_dir=tmp_path)  # converts, caches
    assert "converting its config and tokenizer once" in caplog.text

    def full_reader(*_a, **_k):
        raise AssertionError("a cached start parsed the whole GGUF metadata")

    monkeypatch.setattr(gguf_reader, "GGUFReader", full_reader)
    later = load_checkpoint(str(smollm2_gguf), cache_dir=tmp_path)
    assert later.quantization == first.quantization == "gguf"
    assert later.tokenizer.encode("Hello there") == first.tokenizer.encode("Hello there")
    assert next(later.weights())[0] == next(first.weights())[0]

