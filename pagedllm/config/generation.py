"""Default sampling parameters from the model's generation_config.json (vLLM's
`--generation-config`).

    auto    read generation_config.json of the model directory (the default, as in vLLM)
    vllm    ignore it: the OpenAI defaults (temperature 1, top_p 1, no top_k, no penalty)
    FOLDER  read FOLDER/generation_config.json

Only the sampling fields vLLM takes are used, and only those the file sets to a non-default
value (`GenerationConfig.to_diff_dict`); a request's own value always wins.
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)

# generation_config.json key -> SamplingParams field
_FIELDS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
           "min_p": "min_p", "repetition_penalty": "repetition_penalty"}


def validate_generation_config(value: str) -> None:
    if value in ("auto", "vllm"):
        return
    if not Path(value).expanduser().is_dir():
        raise ValueError(f"generation_config must be 'auto', 'vllm' or a folder holding "
                         f"generation_config.json; {value!r} is not a folder")


def sampling_defaults(generation_config: str, model_path: Path | None) -> dict[str, float | int]:
    """SamplingParams defaults ({field: value}) the model's generation config asks for."""
    if generation_config == "vllm":
        return {}
    folder = model_path if generation_config == "auto" else Path(generation_config).expanduser()
    if folder is None or not (folder / "generation_config.json").is_file():
        if generation_config != "auto":
            raise ValueError(f"no generation_config.json in {folder}")
        return {}
    from transformers import GenerationConfig

    diff = GenerationConfig.from_pretrained(folder, local_files_only=True).to_diff_dict()
    defaults = {field: diff[key] for key, field in _FIELDS.items() if diff.get(key) is not None}
    if defaults:
        logger.info("sampling defaults from %s/generation_config.json: %s (a request's own "
                    "values win; --generation-config vllm ignores the file)", folder, defaults)
    return defaults
