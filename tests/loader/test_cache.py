"""GGUF cache helpers: entry keys, atomic entry creation, streaming safetensors writer."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from pagedllm.loader.cache import (
    CACHE_DIR_ENV,
    build_atomically,
    cache_root,
    gguf_entry_dir,
    write_safetensors,
)


def test_cache_root_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    assert cache_root() == Path.home() / ".cache" / "pagedllm"
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"


def test_entry_key_changes_with_file(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"abc")
    first = gguf_entry_dir(gguf, tmp_path / "cache")
    assert first == gguf_entry_dir(gguf, tmp_path / "cache")
    assert first.parent == tmp_path / "cache" / "gguf"
    gguf.write_bytes(b"abcd")
    assert gguf_entry_dir(gguf, tmp_path / "cache") != first
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert len({first, gguf_entry_dir(gguf, tmp_path / "cache")}) == 2


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    final = tmp_path / "gguf" / "entry"

    def populate(tmp: Path) -> None:
        (tmp / "half-written").write_bytes(b"x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_atomically(final, populate)
    assert list(final.parent.iterdir()) == []


def test_concurrent_build_keeps_existing_entry(tmp_path: Path) -> None:
    final = tmp_path / "gguf" / "entry"
    final.mkdir(parents=True)
    (final / "theirs").write_bytes(b"done")
    assert build_atomically(final, lambda tmp: (tmp / "ours").write_bytes(b"x")) == final
    assert sorted(p.name for p in final.parent.iterdir()) == ["entry"]
    assert [p.name for p in final.iterdir()] == ["theirs"]


def test_write_safetensors_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    arrays = {"a.weight": rng.standard_normal((3, 5), dtype=np.float32)}
    arrays["b.bias"] = rng.standard_normal(7, dtype=np.float32)
    arrays["c"] = rng.standard_normal((2, 3, 4), dtype=np.float32)
    path = tmp_path / "w.safetensors"
    write_safetensors(path, [(n, a.shape) for n, a in arrays.items()], iter(arrays.items()))
    with safe_open(str(path), framework="pt") as handle:
        assert set(handle.keys()) == set(arrays)
        for name, array in arrays.items():
            assert torch.equal(handle.get_tensor(name), torch.from_numpy(array))


def test_write_safetensors_rejects_mismatch(tmp_path: Path) -> None:
    array = np.zeros((2, 2), dtype=np.float32)
    with pytest.raises(ValueError, match="does not match"):
        write_safetensors(tmp_path / "w.safetensors", [("x", (4,))], iter([("x", array)]))
