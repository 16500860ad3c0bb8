"""The argument types of the CLI's flags (argparse `type=` callables): vLLM's human-readable
token counts, sizes, JSON configs, process counts and --lora-modules entries; each turns bad
text into one argparse error naming the accepted forms."""

from __future__ import annotations

import argparse
import json

from pagedllm.config.pooler import PoolerConfig
from pagedllm.config.speculative import SpeculativeConfig
from pagedllm.lora.request import LoRARequest

_HUMAN_INT = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}


def human_int(text: str) -> int:
    """vLLM's human-readable integers: '4096', '4k' = 4000, '4K' = 4096, '1.5m', '25.6k'."""
    text = text.strip()
    mult = _HUMAN_INT.get(text[-1:], 1)
    number = text[:-1] if mult != 1 else text
    try:
        value = float(number) * mult if mult != 1 else int(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a token count (e.g. 4096, 4k = 4000, 4K = 4096)") from None
    if value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens")
    return int(value)


def size(text: str) -> int:
    from pagedllm.config import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def gib(text: str) -> float:
    """GiB for a plain number (vLLM's --swap-space), else a size with a unit."""
    try:
        return float(text)
    except ValueError:
        return size(text) / 2**30


def speculative_config(text: str) -> SpeculativeConfig | None:
    try:
        return SpeculativeConfig.parse(text)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def pooler_config(text: str) -> PoolerConfig | None:
    try:
        return PoolerConfig.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def rope_scaling(text: str) -> dict | None:
    from pagedllm.model.layers.rope_scaling import parse_rope_scaling

    try:
        return parse_rope_scaling(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parallel_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process count (an int >= 1)")
    return value


def parse_lora_module(text: str) -> LoRARequest:
    """`name=path`, or vLLM's JSON form '{"name": ..., "path": ..., "base_model_name": ...}'.
    Ids are assigned later (`number_lora_modules`)."""
    text = text.strip()
    try:
        if text.startswith("{"):
            spec = json.loads(text)
            name, path = spec["name"], spec["path"]
            base = spec.get("base_model_name")
        else:
            name, sep, path = text.partition("=")
            if not sep:
                raise ValueError
            base = None
        return LoRARequest(name, 1, path, base)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError):
        raise argparse.ArgumentTypeError(
            f"--lora-modules entries are name=path or JSON with name and path, got {text!r}"
        ) from None


def number_lora_modules(modules: list[LoRARequest] | None) -> list[LoRARequest]:
    """Give the --lora-modules adapters ids 1, 2, ...; refuses duplicate names."""
    out: list[LoRARequest] = []
    for i, m in enumerate(modules or [], start=1):
        if any(o.lora_name == m.lora_name for o in out):
            raise ValueError(f"--lora-modules names {m.lora_name!r} twice")
        out.append(LoRARequest(m.lora_name, i, m.lora_path, m.base_model_name))
    return out
