"""DeepSeek V3 / R1 calls, and V3.1's shorter form, between its special-token markers:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>                                (V3, R1)

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>                                   (V3.1)

Text before the calls marker is content; each call is emitted when its end marker arrives.
"""

from __future__ import annotations

import re

from pagedllm.entrypoints.tool_parsers.base import (
    ParsedToolCall,
    TaggedToolParser,
    call_with_args,
    register_tool_parser,
)

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_FENCED = re.compile(r"\A([^\n]+)\n```(?:json)?\n(.*)\n```\s*\Z", re.DOTALL)


@register_tool_parser
class DeepSeekV3ToolParser(TaggedToolParser):
    name = "deepseek_v3"
    special_tokens = True
    calls_start, call_start, call_end = CALLS_BEGIN, CALL_BEGIN, CALL_END

    def parse_call(self, body: str) -> ParsedToolCall | None:
        kind, sep, rest = body.partition(SEP)
        if not sep:
            return None
        fenced = _FENCED.match(rest.strip("\n"))
        if fenced is not None:  # V3: the type, then the name and a fenced JSON block
            return call_with_args(fenced.group(1).strip(), fenced.group(2))
        return call_with_args(kind.strip(), rest.strip())  # V3.1: name<sep>JSON
