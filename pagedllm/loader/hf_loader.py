"""Load a Hugging Face model directory (config.json, tokenizer, *.safetensors).

Only safetensors checkpoints are supported: they can be memory-mapped and read
one tensor at a time, so loading never holds a second full copy of the model.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoTokenizer

from pagedllm.errors import ModelNotFoundError
from pagedllm.loader import multimodal_text
from pagedllm.loader.checkpoint import Checkpoint
from pagedllm.loader.errors import UnsupportedModelError
from pagedllm.model.layers.quant import hf_checkpoint

logger = logging.getLogger(__name__)

_INDEX_FILE = "model.safetensors.index.json"


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files of ``model_dir``: the shards named by the index, or all *.safetensors."""
    index = model_dir / _INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ModelNotFoundError(f"{index} lists missing shard files: {missing}")
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(
            f"no *.safetensors files in {model_dir}; only safetensors checkpoints are supported"
        )
    return files


def iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, float32 CPU tensor)`` one at a time from memory-mapped files."""
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a Mapping
                yield name, handle.get_tensor(name).float()


def load_hf_checkpoint(model_dir: Path) -> Checkpoint:
    """Load config and tokenizer from ``model_dir`` (local files only); weights stay lazy."""
    start = time.perf_counter()
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    config_done = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    files = safetensors_files(model_dir)
    logger.info(
        "read %s: config %.2fs, tokenizer %.2fs (%d weight file(s))",
        model_dir,
        config_done - start,
        time.perf_counter() - config_done,
        len(files),
    )
    if multimodal_text.text_architecture(config) is not None:  # its language model only
        if hf_checkpoint.checkpoint_quantization(config) is not None:
            raise UnsupportedModelError(f"{model_dir}: quantized vision-language checkpoints "
                                        "are not supported yet; use a float checkpoint")
        return Checkpoint(
            config=multimodal_text.text_config(config, multimodal_text.weight_names(files)),
            tokenizer=tokenizer,
            weights=lambda: multimodal_text.iter_text_weights(files),
            source=model_dir,
        )
    return Checkpoint(
        config=config,
        tokenizer=tokenizer,
        # AWQ / GPTQ: one QuantizedWeight per quantized module instead of its int32 parts
        weights=(hf_checkpoint.quantized_weights_fn(config, files)
                 or (lambda: iter_safetensors(files))),
        source=model_dir,
        quantization=getattr(hf_checkpoint.checkpoint_quantization(config), "method", "none"),
    )
