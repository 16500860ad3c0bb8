"""On-disk cache of GGUF conversions, so the second start of a model is fast.

Converting a GGUF file (parse metadata, build the HF tokenizer, dequantize) takes
~10 s; reading the converted result back takes well under a second. Each GGUF
file gets one entry, keyed by its resolved path, size and mtime, holding a plain
HF model directory::

    $PAGEDLLM_CACHE_DIR (default ~/.cache/pagedllm)/
      gguf/<stem>-<sha256(version|path|size|mtime)[:16]>/
        config.json  tokenizer.json  tokenizer_config.json  chat_template.jinja
        model.safetensors            (float32, HF parameter names; written only by a dense
                                      `--quantization none` load: the quantized path reads
                                      the GGUF itself and writes nothing dequantized)

An entry is built in a hidden temporary directory and renamed into place, so a
killed process never leaves a half-written entry under the final name.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "PAGEDLLM_CACHE_DIR"
# Bump when the entry layout or the conversion changes, to invalidate old entries.
_FORMAT_VERSION = "2"  # 2: llama configs carry rope_freq_factors (Llama 3.1 RoPE)


def cache_root(cache_dir: Path | None = None) -> Path:
    """``cache_dir`` if given, else ``$PAGEDLLM_CACHE_DIR``, else ``~/.cache/pagedllm``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "pagedllm"


def gguf_entry_dir(gguf_path: Path, cache_dir: Path | None = None) -> Path:
    """Cache entry directory of ``gguf_path`` (it may not exist yet)."""
    stat = gguf_path.stat()
    key = f"{_FORMAT_VERSION}|{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root(cache_dir) / "gguf" / f"{gguf_path.stem}-{digest}"


def build_atomically(final_dir: Path, populate: Callable[[Path], None]) -> Path:
    """Run ``populate(tmp_dir)``, then rename ``tmp_dir`` to ``final_dir``.

    If another process renamed its own entry into place first, ours is dropped
    and theirs (built from the same file) is used.
    """
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.tmp-", dir=final_dir.parent))
    try:
        populate(tmp_dir)
        try:
            os.rename(tmp_dir, final_dir)
        except OSError:
            if not final_dir.is_dir():
                raise
            logger.info("cache entry %s was built concurrently; using it", final_dir)
            shutil.rmtree(tmp_dir, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return final_dir


def write_safetensors(
    path: Path,
    specs: Iterable[tuple[str, tuple[int, ...]]],
    arrays: Iterator[tuple[str, np.ndarray]],
) -> None:
    """Write float32 tensors to a safetensors file, one tensor in memory at a time.

    ``safetensors.torch.save_file`` needs the whole state dict at once; here the
    header is computed from ``specs`` (name, shape) up front and ``arrays`` must
    then yield the same names and shapes in the same order.

    File layout: ``u64 little-endian header size | JSON header (space padded to
    8 bytes) | tensor bytes back to back, in header order``.
    """
    specs = list(specs)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in specs:
        nbytes = 4 * math.prod(shape)
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(blob)))
        file.write(blob)
        for (name, shape), (got_name, array) in zip(specs, arrays, strict=True):
            if got_name != name or array.shape != tuple(shape) or array.dtype != np.float32:
                raise ValueError(
                    f"tensor {got_name} {array.dtype}{array.shape} does not match the "
                    f"planned {name} float32{tuple(shape)}"
                )
            file.write(np.ascontiguousarray(array).data)
