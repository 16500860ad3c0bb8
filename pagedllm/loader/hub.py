"""Models by Hugging Face Hub name (`Org/Model`), resolved as vLLM does.

    1. the local HF cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
       (or --download-dir), layout  models--Org--Model/{refs/<branch>, snapshots/<commit>/}
    2. when online (HF_HUB_OFFLINE unset), a download of the weights, config and tokenizer
       files into that cache, with huggingface_hub's progress bars.

The environment is read at call time (huggingface_hub reads it once, at import), so a
server started with HF_HUB_OFFLINE=1 never touches the network.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from pagedllm.errors import ModelNotFoundError

logger = logging.getLogger(__name__)

# What a model directory needs: weights, config, tokenizer, chat template.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_TRUE = {"1", "ON", "YES", "TRUE"}


def looks_like_repo_id(name: str) -> bool:
    """`Org/Model` or `Model`: no path syntax (./, ~, more than one /, .gguf)."""
    return bool(_REPO_ID.match(name)) and not name.lower().endswith(".gguf")


def hub_cache_dir(download_dir: str | Path | None = None) -> Path:
    if download_dir is not None:
        return Path(download_dir).expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface") / "hub"


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE


def resolve_hub_model(repo_id: str, revision: str | None = None,
                      download_dir: str | Path | None = None) -> Path:
    """The snapshot directory of `repo_id` at `revision` (default: main), from the cache or
    downloaded. Raises ModelNotFoundError with what was looked for and where."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cache = hub_cache_dir(download_dir)
    rev = revision or "main"
    kwargs = dict(repo_id=repo_id, revision=revision, cache_dir=cache,
                  allow_patterns=ALLOW_PATTERNS)
    try:
        path = Path(snapshot_download(local_files_only=True, **kwargs))
        logger.info("using %s (revision %s) from the HF cache %s", repo_id, rev, path)
        return path
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        pass
    if hub_offline():
        raise ModelNotFoundError(
            f"model {repo_id!r} (revision {rev}) is neither a local path nor in the Hugging "
            f"Face cache {cache / ('models--' + repo_id.replace('/', '--'))}, and downloads "
            "are off (HF_HUB_OFFLINE=1); download it while online or pass a local directory")
    logger.info("downloading %s (revision %s) into %s", repo_id, rev, cache)
    try:
        return Path(snapshot_download(**kwargs))
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise ModelNotFoundError(
            f"model {repo_id!r} (revision {rev}) is not a local path and could not be "
            f"downloaded from the Hugging Face Hub into {cache}: {exc}") from None
