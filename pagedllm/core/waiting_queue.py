"""The scheduler's waiting queue, in one of two orders:

* "fcfs": arrival order (a deque); a preempted request goes back to the front;
* "priority": by (priority, arrival), lower first, as vLLM's --scheduling-policy priority; a
  preempted request goes back to its place by that key (ahead of later arrivals of its
  priority), so a late high-priority request overtakes queued low-priority ones.

It also counts the distinct request groups it holds (an n > 1 request preempted after its
fan-out waits as several sequences), so the waiting gauge and the admission check are O(1)
instead of a set over the whole queue on every add (that made adding N prompts O(N^2)).
Removing many requests at once (`remove_many`, an aborted 20,000-prompt call) is one pass.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, deque
from collections.abc import Iterable, Iterator

from pagedllm.core.request import Request

POLICIES = ("fcfs", "priority")


class WaitingQueue:
    def __init__(self, policy: str = "fcfs") -> None:
        if policy not in POLICIES:
            raise ValueError(f"scheduling policy must be one of {', '.join(POLICIES)}, "
                             f"got {policy!r}")
        self.by_priority = policy == "priority"
        self._items: deque[Request] | list[Request] = [] if self.by_priority else deque()
        self._groups: Counter[str] = Counter()
        self._seq = itertools.count()  # arrival order, kept on the request (priority ties)

    # ---------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items)

    def __contains__(self, request: object) -> bool:
        return any(r is request for r in self._items)

    def __getitem__(self, index: int) -> Request:
        return self._items[index]

    @property
    def num_groups(self) -> int:
        """Distinct requests (groups) waiting; what the waiting gauge counts."""
        return len(self._groups)

    # ---------------------------------------------------------------- writing
    def append(self, request: Request) -> None:
        """A new arrival: at the back (fcfs) or at its place by (priority, arrival)."""
        self._insert(request, front=False)

    def appendleft(self, request: Request) -> None:
        """A preempted or passed-over request: the front (fcfs) or its place (priority)."""
        self._insert(request, front=True)

    def extendleft(self, requests: Iterable[Request]) -> None:
        for r in requests:
            self.appendleft(r)

    def popleft(self) -> Request:
        request = self._items.popleft() if not self.by_priority else self._items.pop(0)
        self._forget(request)
        return request

    def remove(self, request: Request) -> None:
        self._items.remove(request)
        self._forget(request)

    def remove_many(self, requests: Iterable[Request]) -> None:
        """Remove these requests (all waiting) in one pass over the queue."""
        gone = {id(r) for r in requests}
        if not gone:  # every step finishes running requests: no pass over a long queue
            return
        kept = [r for r in self._items if id(r) not in gone]
        for r in self._items:
            if id(r) in gone:
                self._forget(r)
        self._items = kept if self.by_priority else deque(kept)

    # --------------------------------------------------------------- internals
    @staticmethod
    def _key(request: Request) -> tuple[int, int]:
        return request.priority, request.queue_order

    def _insert(self, request: Request, front: bool) -> None:
        if request.queue_order is None:
            request.queue_order = next(self._seq)
        self._groups[request.group_id] += 1
        if self.by_priority:
            bisect.insort(self._items, request, key=self._key)
        elif front:
            self._items.appendleft(request)
        else:
            self._items.append(request)

    def _forget(self, request: Request) -> None:
        self._groups[request.group_id] -= 1
        if not self._groups[request.group_id]:
            del self._groups[request.group_id]
