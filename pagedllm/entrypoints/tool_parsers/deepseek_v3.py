"""DeepSeek V3 / R1 calls, and V3.1's shorter form, between its special-token markers:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>                                (V3, R1)

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>                                   (V3.1)

Text before the calls marker is content; each call's arguments stream as they are written and
the call completes when its end marker arrives.
"""

from __future__ import annotations

import re

from pagedllm.entrypoints.tool_parsers.base import (
    ParsedToolCall,
    TaggedToolParser,
    call_with_raw_args,
    json_value_end,
    register_tool_parser,
)

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
# V3: the type, <sep>, the name, a fenced JSON block; V3.1: the name, <sep>, the JSON
_V3 = re.compile(r"[^\n]*?" + re.escape(SEP) + r"([^\n]+)\n```(?:json)?\n(?=\{)")
_V31 = re.compile(r"([^\n<]+?)" + re.escape(SEP) + r"\s*(?=\{)")
_V3_TAIL = re.compile(r"\s*```\s*\Z")


@register_tool_parser
class DeepSeekV3ToolParser(TaggedToolParser):
    name = "deepseek_v3"
    special_tokens = True
    calls_start, call_start, call_end = CALLS_BEGIN, CALL_BEGIN, CALL_END

    def locate_args(self, body: str) -> tuple[str, int] | None:
        m = _V3.match(body) or _V31.match(body)
        return (m.group(1).strip(), m.end()) if m else None

    def parse_call(self, body: str) -> ParsedToolCall | None:
        found = self.locate_args(body)
        if found is None:
            return None
        name, start = found
        end = json_value_end(body, start)
        if end is None:
            return None
        fenced = _V3.match(body) is not None
        tail = body[end:]
        if (fenced and not _V3_TAIL.match(tail)) or (not fenced and tail.strip()):
            return None
        return call_with_raw_args(name, body[start:end])
