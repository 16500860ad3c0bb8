"""Strict JSON schemas: objects without an `additionalProperties` keyword get
`"additionalProperties": false`.

JSON Schema lets an object carry any property it does not declare unless the schema says
otherwise, and a grammar compiled to the letter lets a model use that: a tool call without
`"additionalProperties": false` (most LangChain `@tool` schemas) drifted into invented keys
until max_tokens cut it, and clients then dropped the call as invalid. vLLM's default grammar
backend (xgrammar) compiles schemas this way, and its guidance backend does the same under
`disable_additional_properties`; the server applies it to tool calls and `strict: true`
response formats unless `--structured-outputs-config.disable_additional_properties false`.

Only subschema positions are walked (a property *named* "properties" is not a schema), and the
direct branches of `allOf` are left open: each would otherwise forbid its siblings' keys.
"""

from __future__ import annotations

import copy
import json
from typing import Any

# keyword -> how its value holds subschemas
_ONE = (
    "additionalProperties",
    "items",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
)
_LIST = ("anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def close_objects(schema: str | dict[str, Any] | bool) -> dict[str, Any] | bool:
    """A copy of `schema` in which every object schema that declares `properties` or
    `patternProperties` and says nothing of `additionalProperties` forbids other keys."""
    out = json.loads(schema) if isinstance(schema, str) else copy.deepcopy(schema)
    _walk(out, close=True)
    return out


def _walk(node: Any, close: bool) -> None:
    if not isinstance(node, dict):
        return
    for key in _ONE:
        value = node.get(key)
        if isinstance(value, list):  # draft-04 tuple `items`
            for sub in value:
                _walk(sub, close=True)
        else:
            _walk(value, close=True)
    for key in _LIST:
        for sub in node.get(key) or []:
            _walk(sub, close=True)
    for sub in node.get("allOf") or []:
        _walk(sub, close=False)
    for key in _MAP:
        value = node.get(key)
        if isinstance(value, dict):
            for sub in value.values():
                _walk(sub, close=True)
    if (
        close
        and "additionalProperties" not in node
        and "unevaluatedProperties" not in node
        and ("properties" in node or "patternProperties" in node)
    ):
        node["additionalProperties"] = False
