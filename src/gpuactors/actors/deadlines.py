"""Ask deadlines: one loop timer per distinct timeout of an actor, not one per ask.

A ``loop.call_later`` per ask costs more than the rest of the ask together: each
timer is a Python object pushed on the loop's heap with Python-level comparisons.
Asks to one actor with the same timeout expire in the order they were sent, so each
distinct timeout keeps a FIFO of ``(deadline, envelope)`` and a single
``loop.call_at`` for its oldest entry. Answered asks are dropped from the front as
new ones arrive (actors answer mostly in order), and the queue is compacted when
out-of-order answers (deferred replies) let it grow, so memory stays proportional
to the asks still waiting.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from gpuactors.actors.mailbox import Envelope
from gpuactors.errors import AskTimeout

_COMPACT_FLOOR = 256


def expire(reply: asyncio.Future[Any], path: str, envelope: Envelope, timeout: float) -> None:
    """Fail ``reply`` with AskTimeout, unless it is already done."""
    if not reply.done():
        reply.set_exception(
            AskTimeout(
                f"{path}: no reply to {type(envelope[0]).__name__} within {timeout}s "
                f"(correlation id {envelope[2]})"
            )
        )


class _TimeoutQueue:
    """Pending asks that share one timeout, oldest first, behind one loop timer."""

    __slots__ = ("_compact_at", "_entries", "_owner", "_timer", "timeout")

    def __init__(self, owner: AskDeadlines, timeout: float) -> None:
        self._owner = owner
        self.timeout = timeout
        self._entries: deque[tuple[float, asyncio.Future[Any], Envelope]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._compact_at = _COMPACT_FLOOR

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, deadline: float, reply: asyncio.Future[Any], envelope: Envelope) -> None:
        entries = self._entries
        while entries and entries[0][1].done():
            entries.popleft()
        entries.append((deadline, reply, envelope))
        if self._timer is None:
            self._timer = self._owner.loop.call_at(deadline, self._expire)
        elif len(entries) > self._compact_at:
            live = [entry for entry in entries if not entry[1].done()]
            self._entries = deque(live)
            self._compact_at = 2 * len(live) + _COMPACT_FLOOR

    def _expire(self) -> None:
        self._timer = None
        now = self._owner.loop.time()
        entries = self._entries
        while entries:
            deadline, reply, envelope = entries[0]
            if not reply.done():
                if deadline > now:
                    self._timer = self._owner.loop.call_at(deadline, self._expire)
                    return
                expire(reply, self._owner.path, envelope, self.timeout)
            entries.popleft()
        self._owner.forget(self)


class AskDeadlines:
    """The ask timeouts of one actor, grouped by timeout value."""

    __slots__ = ("_queues", "loop", "path")

    def __init__(self, loop: asyncio.AbstractEventLoop, path: str) -> None:
        self.loop = loop
        self.path = path
        self._queues: dict[float, _TimeoutQueue] = {}

    @property
    def tracked(self) -> int:
        """Asks still held (answered ones may linger until dropped or compacted)."""
        return sum(len(queue) for queue in self._queues.values())

    def add(self, reply: asyncio.Future[Any], envelope: Envelope, timeout: float) -> None:
        """Fail ``reply`` with AskTimeout unless it is done within ``timeout`` seconds."""
        queue = self._queues.get(timeout)
        if queue is None:
            queue = self._queues[timeout] = _TimeoutQueue(self, timeout)
        queue.add(self.loop.time() + timeout, reply, envelope)

    def forget(self, queue: _TimeoutQueue) -> None:
        """Drop an emptied queue, so one-off timeout values do not accumulate."""
        if self._queues.get(queue.timeout) is queue:
            del self._queues[queue.timeout]
