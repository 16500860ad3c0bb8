"""GET /tokenizer_info (vLLM's, behind `--enable-tokenizer-info-endpoint`): the served
tokenizer's configuration, so that a client can tokenize as the server does (lm-eval's
`tokenizer_backend=remote` reads the special tokens and chat template here, then calls
/tokenize and /detokenize).

Off by default, as in vLLM: the route then does not exist and answers 404 like any unknown
path. The body is the tokenizer's init kwargs made JSON-safe (special tokens as their text)
plus `tokenizer_class` and the special tokens and chat template the tokenizer has; paths on
the server's disk (`*_file`, `name_or_path`) are left out.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from pagedllm.entrypoints.openapi_spec import GET_ERRORS

SPECIAL = ("bos_token", "eos_token", "pad_token", "unk_token")


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    content = getattr(value, "content", None)  # tokenizers' AddedToken
    return content if isinstance(content, str) else str(value)


def tokenizer_info(tokenizer) -> dict[str, Any]:
    config = {
        k: v
        for k, v in (getattr(tokenizer, "init_kwargs", None) or {}).items()
        if not k.endswith("_file") and k != "name_or_path"
    }
    info = _json_safe(config)
    info["tokenizer_class"] = type(tokenizer).__name__
    for name in SPECIAL:
        token = getattr(tokenizer, name, None)
        if token is not None:
            info[name] = _json_safe(token)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str):
        info["chat_template"] = template
    limit = info.get("model_max_length")
    if isinstance(limit, float | int) and not limit < 2**63:  # HF's "no limit" 1e30
        del info["model_max_length"]
    return info


def add_tokenizer_info_route(app: FastAPI, tokenizer) -> None:
    """GET /tokenizer_info; computed once (the tokenizer does not change while serving)."""
    info = tokenizer_info(tokenizer)

    @app.get("/tokenizer_info", responses=GET_ERRORS)
    async def get_tokenizer_info() -> dict:
        return info
