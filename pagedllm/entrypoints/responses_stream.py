"""The chat route's stream as a Responses API stream (a `ChunkConverter`, sse_translate.py).

    response.created, response.in_progress
    per output item, in order:
      reasoning (--reasoning-parser): as text, with response.reasoning_text.delta / .done
      text:  response.output_item.added (message), response.content_part.added,
             response.output_text.delta*, response.output_text.done,
             response.content_part.done, response.output_item.done
      call:  response.output_item.added (function_call),
             response.function_call_arguments.delta*, response.function_call_arguments.done,
             response.output_item.done
    response.completed (status "completed", or "incomplete" at max_output_tokens, as vLLM
                        sends it: the openai SDK's stream helpers wait for this event)
    ... or `error` + response.failed where the chat stream reports an engine error

Every event carries a `sequence_number` (0, 1, ...). The final response is handed to
`on_complete` (the store) before response.completed goes out.
"""

from __future__ import annotations

from collections.abc import Callable

from pagedllm.entrypoints.protocol_openai_responses import ResponsesRequest
from pagedllm.entrypoints.responses_output import (
    chat_usage,
    function_call_item,
    item_id,
    message_item,
    output_text,
    reasoning_item,
    reasoning_text,
    response_object,
)
from pagedllm.entrypoints.sse_translate import named_event

# item type -> the prefix of its text events
_TEXT_EVENTS = {"message": "response.output_text", "reasoning": "response.reasoning_text"}


class ResponsesStream:
    def __init__(
        self,
        req: ResponsesRequest,
        resp_id: str,
        created_at: int,
        on_complete: Callable[[dict], None],
    ) -> None:
        self.req, self.resp_id, self.created_at = req, resp_id, created_at
        self.on_complete = on_complete
        self.seq = 0
        self.model: str | None = None
        self.output: list[dict] = []  # finished items
        self.item: dict | None = None  # the item being streamed
        self.text = ""  # its text (message, reasoning) or arguments (function_call)
        self.tool_index: int | None = None
        self.usage: dict | None = None
        self.finish: str | None = None
        self.failed = False

    def _event(self, kind: str, **fields) -> str:
        payload = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return named_event(kind, payload)

    def _response(self, status: str, output: list[dict], usage: dict | None) -> dict:
        return response_object(
            self.req, self.resp_id, self.created_at, self.model or "", status, output, usage
        )

    # ------------------------------------------------------------ chunks
    def chunk(self, data: dict) -> str:
        out = []
        if data.get("usage"):
            self.usage = chat_usage(data["usage"])
        if self.model is None:
            self.model = data["model"]
            created = self._response("in_progress", [], None)
            out.append(self._event("response.created", response=created))
            out.append(self._event("response.in_progress", response=created))
        for choice in data["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                out.append(self._text_delta("reasoning", delta["reasoning_content"]))
            if delta.get("content"):
                out.append(self._text_delta("message", delta["content"]))
            for call in delta.get("tool_calls") or []:
                out.append(self._tool_delta(call))
            if choice.get("finish_reason") is not None:
                self.finish = choice["finish_reason"]
        return "".join(out)

    def _text_delta(self, kind: str, text: str) -> str:
        """Text of a message or reasoning item (opened first if another item is open)."""
        out = ""
        if self.item is None or self.item["type"] != kind:
            out = self._close() + self._open_text(kind)
        self.text += text
        extra = {"logprobs": []} if kind == "message" else {}
        return out + self._event(
            f"{_TEXT_EVENTS[kind]}.delta",
            item_id=self.item["id"],
            output_index=len(self.output),
            content_index=0,
            delta=text,
            **extra,
        )

    def _open_text(self, kind: str) -> str:
        item = (
            message_item("", "in_progress")
            if kind == "message"
            else reasoning_item("", "in_progress")
        )
        part = output_text("") if kind == "message" else reasoning_text("")
        item["content"] = []
        self.item, self.text = item, ""
        index = len(self.output)
        return self._event(
            "response.output_item.added", output_index=index, item=item
        ) + self._event(
            "response.content_part.added",
            item_id=item["id"],
            output_index=index,
            content_index=0,
            part=part,
        )

    def _tool_delta(self, call: dict) -> str:
        out = []
        fn = call.get("function") or {}
        if (
            call.get("id")
            or self.item is None
            or self.item["type"] != "function_call"
            or call["index"] != self.tool_index
        ):
            out.append(self._close())
            self.tool_index, self.text = call["index"], ""
            self.item = function_call_item(
                call.get("id") or item_id("call"), fn.get("name") or "", "", status="in_progress"
            )
            out.append(
                self._event(
                    "response.output_item.added", output_index=len(self.output), item=self.item
                )
            )
        if fn.get("arguments"):
            self.text += fn["arguments"]
            out.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=self.item["id"],
                    output_index=len(self.output),
                    delta=fn["arguments"],
                )
            )
        return "".join(out)

    def _close(self) -> str:
        """Finish the item being streamed: its done events, then it joins the output."""
        item, self.item = self.item, None
        if item is None:
            return ""
        index = len(self.output)
        if item["type"] in _TEXT_EVENTS:
            status = "incomplete" if self.finish == "length" else "completed"
            make = message_item if item["type"] == "message" else reasoning_item
            done = make(self.text, status, item["id"])
            extra = {"logprobs": []} if item["type"] == "message" else {}
            out = self._event(
                f"{_TEXT_EVENTS[item['type']]}.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=self.text,
                **extra,
            ) + self._event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=done["content"][0],
            )
        else:
            done = function_call_item(item["call_id"], item["name"], self.text, fc_id=item["id"])
            out = self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=self.text,
            )
        self.output.append(done)
        return out + self._event("response.output_item.done", output_index=index, item=done)

    # --------------------------------------------------------------- end
    def error(self, error: dict) -> str:
        self.failed = True
        failed = self._response("failed", self.output, self.usage)
        failed["error"] = {
            "code": error.get("type") or "server_error",
            "message": str(error.get("message", "")),
        }
        return self._event(
            "error",
            code=error.get("code") or error.get("type"),
            message=str(error.get("message", "")),
            param=error.get("param"),
        ) + self._event("response.failed", response=failed)

    def done(self) -> str:
        if self.failed:
            return ""
        out = self._close()
        if not self.output:  # nothing at all was generated: one empty message, as unstreamed
            out += self._open_text("message") + self._close()
        status = "incomplete" if self.finish == "length" else "completed"
        final = self._response(status, self.output, self.usage)
        self.on_complete(final)
        return out + self._event("response.completed", response=final)
