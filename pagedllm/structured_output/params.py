"""`StructuredOutputsParams`: what a request's output must match (vLLM's names).

Exactly one of `json` (a JSON schema, dict or string), `regex`, `choice` (a list of
strings), `grammar` (Lark or GBNF/EBNF text) or `json_object` (any JSON object) is set.
Validated here for shape only; whether the backend can compile it is checked when the
request is added (a `GrammarCompileError` with the backend's message).
"""

from __future__ import annotations

import json as _json
from dataclasses import dataclass
from typing import Any

_KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # JSON output is compact by default (", " and ": " separators, no other whitespace),
    # so that a model cannot pad a bounded schema with endless whitespace; a pattern here
    # allows whitespace matching it between JSON tokens instead.
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        if self.json_object is False:
            self.json_object = None
        chosen = [k for k in _KINDS if getattr(self, k) is not None]
        if len(chosen) != 1:
            raise ValueError(
                "structured_outputs must set exactly one of json, regex, choice, grammar, "
                f"json_object; got {', '.join(chosen) if chosen else 'none'}")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    parsed = _json.loads(self.json)
                except ValueError as exc:
                    raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
            else:
                parsed = self.json
            if not isinstance(parsed, dict | bool):
                raise ValueError("structured_outputs.json must be a JSON schema object, got "
                                 f"{type(parsed).__name__}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"structured_outputs.{name} must be a non-empty string")
        if self.choice is not None:
            if (not isinstance(self.choice, list | tuple) or not self.choice
                    or not all(isinstance(c, str) and c for c in self.choice)):
                raise ValueError("structured_outputs.choice must be a non-empty list of "
                                 f"non-empty strings, got {self.choice!r}")
            self.choice = list(self.choice)
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            raise ValueError("structured_outputs.whitespace_pattern must be a string")

    @property
    def kind(self) -> str:
        return next(k for k in _KINDS if getattr(self, k) is not None)

    def cache_key(self) -> tuple[str, str, str | None]:
        """(kind, canonical spec text, whitespace pattern): equal keys compile alike."""
        kind = self.kind
        value = getattr(self, kind)
        if kind == "json":
            text = _json.dumps(_json.loads(value) if isinstance(value, str) else value,
                               sort_keys=True)
        elif kind == "choice":
            text = _json.dumps(value)
        elif kind == "json_object":
            text = ""
        else:
            text = value
        return kind, text, self.whitespace_pattern
