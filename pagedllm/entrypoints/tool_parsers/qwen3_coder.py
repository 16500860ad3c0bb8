"""Qwen3-Coder's XML calls (its chat template's format), any number:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Values are raw text (one newline around them is trimmed); they become JSON by the type the
tool's schema gives the parameter, as vLLM's parser does: strings stay text, integers /
numbers / booleans / null are read as such, objects and arrays as JSON; a parameter the schema
does not type is JSON if it parses and text otherwise.
"""

from __future__ import annotations

import json
import re

from pagedllm.entrypoints.tool_parsers.base import (
    ParsedToolCall,
    PartialCall,
    TaggedToolParser,
    register_tool_parser,
)

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*\Z", re.DOTALL)
_OPENED = re.compile(r"\s*<function=([^>\n]+)>")
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


@register_tool_parser
class Qwen3CoderToolParser(TaggedToolParser):
    name = "qwen3_coder"
    call_start, call_end = "<tool_call>", "</tool_call>"

    def parse_call(self, body: str) -> ParsedToolCall | None:
        m = _FUNCTION.match(body)
        if m is None:
            return None
        name = m.group(1).strip()
        return ParsedToolCall(name, json.dumps(self._args(name, m.group(2)), ensure_ascii=False))

    def partial(self) -> PartialCall | None:
        """Once `<function=NAME>` is in: the arguments of the parameters closed so far, as the
        head of the JSON the whole call will carry (`{"a": 1` before `, "b": 2}`)."""
        m = _OPENED.match(self._buf) if self._in_call else None
        if m is None:
            return None
        name = m.group(1).strip()
        params = self._buf[m.end() :]
        end = params.rfind("</parameter>")
        done = params[: end + len("</parameter>")] if end >= 0 else ""  # closed ones only
        return PartialCall(name, json.dumps(self._args(name, done), ensure_ascii=False)[:-1])

    def _args(self, name: str, params: str) -> dict:
        types = self.parameters_of(name)
        args = {}
        for key, raw in _PARAMETER.findall(params):
            key = key.strip()
            args[key] = _value(_trim(raw), (types.get(key) or {}).get("type"))
        return args


def _trim(raw: str) -> str:
    return raw.removeprefix("\n").removesuffix("\n")


def _value(text: str, kind: str | list | None) -> object:
    kinds = kind if isinstance(kind, list) else [kind]
    if kinds == ["string"]:
        return text
    if text.strip().lower() == "null" and (None in kinds or "null" in kinds):
        return None
    for k in kinds:
        try:
            if k == "integer":
                return int(text.strip())
            if k == "number":
                number = float(text.strip())
                return int(number) if number.is_integer() and "." not in text else number
            if k == "boolean" and text.strip().lower() in ("true", "false"):
                return text.strip().lower() == "true"
            if k in ("object", "array", None):
                value = json.loads(text)
                if k is None or isinstance(value, dict if k == "object" else list):
                    return value
        except ValueError:
            continue
    return text
