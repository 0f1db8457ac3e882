"""Ask deadlines: one loop timer per distinct timeout of an actor, not one per ask.

A ``loop.call_later`` per ask costs more than the rest of the ask together: each
timer is a Python object pushed on the loop's heap with Python-level comparisons.
Asks to one actor with the same timeout expire in the order they were sent, so each
distinct timeout keeps a FIFO of deadlines and a single ``loop.call_at`` for its
oldest entry.

An ask that is over (answered, timed out, or given up by its caller) is *settled* by
its asker at once: its entry lets go of the message and the reply, so a large payload
is freed with the reply, not when the timeout would have run out. Settled entries
leave the front of their queue at once (actors answer mostly in order), and the queue
is compacted when out-of-order answers (deferred replies) let it grow. A queue left
empty keeps its timer for the next ask with the same timeout (the common case: a
caller that always passes the same value), unless the actor has more than
``_IDLE_QUEUES_KEPT`` queues: then it cancels its timer and goes, so callers that pass
a different timeout each time (a remaining budget) leave no timers behind.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from typing import Any, TypeVar

from gpuactors.actors.mailbox import Envelope
from gpuactors.errors import AskTimeout, GpuActorsError

T = TypeVar("T")

_COMPACT_FLOOR = 256

#: Empty queues an actor keeps (each with its timer) for timeouts that come back.
_IDLE_QUEUES_KEPT = 8

#: One ask in a timeout queue: ``[deadline, reply, envelope, queue]``. A list, not a
#: tuple, so that ``AskDeadlines.settle`` can empty it in place (the queue may hold the
#: emptied list until it reaches the front); a list is also cheaper to build than a
#: class on the ask path. ``reply`` is None once settled.
Deadline = list[Any]


def expire(reply: asyncio.Future[Any], path: str, envelope: Envelope, timeout: float) -> None:
    """Fail ``reply`` with AskTimeout, unless it is already done."""
    if not reply.done():
        reply.set_exception(
            AskTimeout(
                f"{path}: no reply to {type(envelope[0]).__name__} within {timeout}s "
                f"(correlation id {envelope[2]})"
            )
        )


def _is_over(entry: Deadline) -> bool:
    reply = entry[1]
    return reply is None or reply.done()


class _TimeoutQueue:
    """Pending asks that share one timeout, oldest first, behind one loop timer."""

    __slots__ = ("_compact_at", "_due", "_owner", "_timer", "entries", "timeout")

    def __init__(self, owner: AskDeadlines, timeout: float) -> None:
        self._owner = owner
        self.timeout = timeout
        self.entries: deque[Deadline] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # the deadline the timer was set for
        self._compact_at = _COMPACT_FLOOR

    def _arm(self, deadline: float) -> None:
        self._due = deadline
        self._timer = self._owner.loop.call_at(deadline, self._expire)

    def add(self, deadline: float, reply: asyncio.Future[Any], envelope: Envelope) -> Deadline:
        entries = self.entries
        while entries and _is_over(entries[0]):
            entries.popleft()
        entry = [deadline, reply, envelope, self]
        entries.append(entry)
        if self._timer is None:
            self._arm(deadline)
        elif len(entries) > self._compact_at:
            live = [item for item in entries if not _is_over(item)]
            self.entries = deque(live)
            self._compact_at = 2 * len(live) + _COMPACT_FLOOR
        return entry

    def drop_settled(self) -> None:
        """Drop the asks that are over from the front."""
        entries = self.entries
        while entries and _is_over(entries[0]):
            entries.popleft()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        """The timer fired: every entry due by the loop's judgment expires. That is
        ``_due`` even where ``loop.time()`` reads a hair earlier: uvloop's clock counts
        whole milliseconds, and it runs a timer set for the past at once, so waiting for
        the clock to pass ``_due`` would spin until the next millisecond."""
        self._timer = None
        due = max(self._owner.loop.time(), self._due)
        entries = self.entries
        while entries:
            deadline, reply, envelope, _ = entries[0]
            if reply is not None and not reply.done():
                if deadline > due:
                    self._arm(deadline)
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
        """Asks whose deadline still holds them (their message and reply future)."""
        return sum(
            1 for queue in self._queues.values() for entry in queue.entries if entry[1] is not None
        )

    @property
    def queues(self) -> int:
        """Distinct timeouts with a queue, hence at most that many loop timers."""
        return len(self._queues)

    def add(self, reply: asyncio.Future[Any], envelope: Envelope, timeout: float) -> Deadline:
        """Fail ``reply`` with AskTimeout unless it is done within ``timeout`` seconds.

        The asker hands the returned entry to :meth:`settle` once the ask is over.
        """
        queue = self._queues.get(timeout)
        if queue is None:
            queue = self._queues[timeout] = _TimeoutQueue(self, timeout)
        return queue.add(self.loop.time() + timeout, reply, envelope)

    def settle(self, entry: Deadline) -> None:
        """The ask is over: let go of its message and reply, and of its queue if empty."""
        queue: _TimeoutQueue | None = entry[3]
        entry[1] = entry[2] = entry[3] = None
        if queue is None:  # settled already
            return
        queue.drop_settled()
        if not queue.entries and len(self._queues) > _IDLE_QUEUES_KEPT:
            queue.cancel()
            self.forget(queue)

    def forget(self, queue: _TimeoutQueue) -> None:
        """Drop an emptied queue, so one-off timeout values do not accumulate."""
        if self._queues.get(queue.timeout) is queue:
            del self._queues[queue.timeout]


async def answered_within(pending: Awaitable[T], timeout: float, unanswered: str) -> T:
    """``pending``'s result, or AskTimeout saying ``unanswered`` once ``timeout`` seconds
    have passed. For asks that are not an actor's own (a group's, a Ray actor's): a
    TaskTimeout from the engine is a TimeoutError too, and keeps its type."""
    try:
        return await asyncio.wait_for(pending, timeout)
    except asyncio.TimeoutError as exc:
        if isinstance(exc, GpuActorsError):  # the engine's own, not the wait's
            raise
        raise AskTimeout(f"{unanswered} in {timeout:g} s") from None
