"""The in-memory store behind `store`, `previous_response_id` and GET / DELETE
/v1/responses/{id}.

Bounded by count (`--max-stored-responses`, default 1000): storing one more evicts the
least recently used (stored or read). Each entry holds its response object and the whole
conversation that led to it (earlier items, input, output), so a chain never depends on an
evicted ancestor; a conversation had to fit into max_model_len tokens once, so an entry's size
is bounded too. The store lives in the API server process: a restart forgets it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from pagedllm.entrypoints.server_options import DEFAULT_MAX_STORED_RESPONSES


@dataclass(frozen=True)
class StoredResponse:
    response: dict  # the response object, as GET returns it
    conversation: list[dict]  # every item up to and including its output (no instructions)


class ResponseStore:
    def __init__(self, max_responses: int = DEFAULT_MAX_STORED_RESPONSES) -> None:
        if max_responses < 1:
            raise ValueError(f"max_responses must be >= 1, got {max_responses}")
        self.max_responses = max_responses
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: StoredResponse) -> None:
        key = entry.response["id"]
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_responses:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        return self._entries.pop(response_id, None) is not None
