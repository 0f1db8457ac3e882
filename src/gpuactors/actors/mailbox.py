"""Mailboxes: the bounded queue between an actor's senders and its processing task.

A mailbox has two lanes. The user lane holds envelopes ``(message, reply_future,
correlation_id)`` and is bounded by :class:`MailboxConfig`; the system lane holds the
runtime's own signals (stop, a child's escalated failure) and is never bounded, so a
full mailbox can always be stopped.

Backpressure is per actor. Under :attr:`Backpressure.WAIT` the asynchronous sends
(``ask``, ``tell_wait``) wait for room, first come first served; under
:attr:`Backpressure.FAIL` they raise :class:`~gpuactors.errors.MailboxFull` at once.
``tell`` is synchronous, so it can never wait: on a full mailbox it raises
``MailboxFull`` whatever the policy.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuactors.actors.checks import optional_count
from gpuactors.errors import InvalidArgument

#: What travels through the user lane: the message, the asker's future (None for a
#: tell) and the ask's correlation id (None for a tell).
Envelope = tuple[Any, "asyncio.Future[Any] | None", "int | None"]


class Backpressure(enum.Enum):
    """What an asynchronous send does when the mailbox is full."""

    WAIT = "wait"
    """Wait for room (bounded by the ask's timeout): slows producers to the actor's pace."""

    FAIL = "fail"
    """Raise :class:`~gpuactors.errors.MailboxFull` at once: lets callers shed load."""


@dataclass(frozen=True, slots=True)
class MailboxConfig:
    """Capacity and backpressure policy of one actor's mailbox.

    ``capacity=None`` makes the mailbox unbounded; ask for it explicitly with
    :meth:`unbounded`, since an unbounded mailbox hides overload until memory runs out.
    """

    capacity: int | None = 1024
    policy: Backpressure = Backpressure.WAIT

    def __post_init__(self) -> None:
        # Kept as the int it stands for (a NumPy int, a 0-d array): a frozen dataclass
        # sets a checked field through object.__setattr__.
        object.__setattr__(self, "capacity", optional_count(self.capacity, "mailbox capacity", 1))
        if not isinstance(self.policy, Backpressure):
            raise InvalidArgument(f"mailbox policy must be a Backpressure, not {self.policy!r}")

    @classmethod
    def unbounded(cls) -> MailboxConfig:
        """A mailbox that never refuses a message."""
        return cls(capacity=None)


class Mailbox:
    """Two lanes plus the futures that park the consumer and the waiting senders.

    Senders that wait for room are served in arrival order: when the consumer takes an
    envelope it *reserves* the freed slot for the first waiting sender, so a
    synchronous ``tell`` cannot steal it. A waiting sender that is cancelled after
    being granted a slot hands the slot on to the next one.
    """

    __slots__ = (
        "_getter",
        "_loop",
        "capacity",
        "closed",
        "policy",
        "putters",
        "reserved",
        "system",
        "user",
    )

    def __init__(self, config: MailboxConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.capacity = config.capacity
        self.policy = config.policy
        self.user: deque[Envelope] = deque()
        self.system: deque[object] = deque()
        self.putters: deque[asyncio.Future[None]] = deque()
        self.closed = False
        self.reserved = 0  # slots granted to waiting senders that have not put yet
        self._getter: asyncio.Future[None] | None = None
        self._loop = loop

    def __len__(self) -> int:
        return len(self.user)

    @property
    def waiting_senders(self) -> int:
        """Senders parked until there is room (not counting cancelled ones)."""
        return sum(1 for waiter in self.putters if not waiter.done())

    # ------------------------------------------------------------------ senders
    def offer(self, envelope: Envelope) -> bool:
        """Queue ``envelope`` if there is room now; False if full or closed."""
        if self.closed or (
            self.capacity is not None and len(self.user) + self.reserved >= self.capacity
        ):
            return False
        self.user.append(envelope)
        self.wake()
        return True

    def force(self, envelope: Envelope) -> bool:
        """Queue ``envelope`` past the capacity (runtime notices such as Terminated).

        Until taken it counts as queued, as any envelope does (``offer``), so taking
        it out of a lane filled past the capacity frees no slot for a waiting sender."""
        if self.closed:
            return False
        self.user.append(envelope)
        self.wake()
        return True

    async def put(self, envelope: Envelope, timeout: float | None, on_timeout: Exception) -> bool:
        """Wait for room, then queue ``envelope``; False if the mailbox closed meanwhile.

        Raises ``on_timeout`` when no room came within ``timeout`` seconds.
        """
        waiter: asyncio.Future[None] = self._loop.create_future()
        self.putters.append(waiter)
        timer = (
            self._loop.call_later(timeout, _fail_waiter, waiter, on_timeout)
            if timeout is not None
            else None
        )
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.reserved -= 1  # granted a slot but leaving: pass it on
                self.grant()
            elif waiter in self.putters:
                self.putters.remove(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        self.reserved -= 1
        if self.closed:
            return False
        self.user.append(envelope)
        self.wake()
        return True

    def drop(self, unwanted: Callable[[Envelope], bool]) -> None:
        """Take the queued envelopes ``unwanted`` picks out of the user lane; the room
        they leave goes to the senders waiting for it."""
        kept = [envelope for envelope in self.user if not unwanted(envelope)]
        if len(kept) < len(self.user):
            self.user.clear()  # in place: the consumer holds this deque
            self.user.extend(kept)
            self.pass_on_room()

    def signal(self, signal: object, *, first: bool = False) -> None:
        """Queue a runtime signal ahead of every user message (``first``: ahead of the
        other signals too)."""
        if not self.closed:
            if first:
                self.system.appendleft(signal)
            else:
                self.system.append(signal)
            self.wake()

    # ----------------------------------------------------------------- consumer
    async def wait(self) -> None:
        """Park the consumer until something arrives in either lane."""
        self._getter = self._loop.create_future()
        await self._getter

    def wake(self) -> None:
        """Unpark the consumer, if parked."""
        getter = self._getter
        if getter is not None:
            self._getter = None
            if not getter.done():
                getter.set_result(None)

    def pass_on_room(self) -> None:
        """Envelopes left the user lane: grant the room there is now to the senders
        waiting for it, counted as ``offer`` counts it (queued envelopes, forced ones
        too, plus the slots granted already), so a lane ``force`` filled past the
        capacity grants nothing until it is back under it."""
        capacity = self.capacity
        while self.putters and (capacity is None or len(self.user) + self.reserved < capacity):
            self.grant()

    def grant(self) -> None:
        """Reserve the slot just freed for the first sender still waiting."""
        while self.putters:
            waiter = self.putters.popleft()
            if not waiter.done():
                self.reserved += 1
                waiter.set_result(None)
                return

    def close(self) -> list[Envelope]:
        """Refuse everything from now on; return the envelopes that were never handled."""
        self.closed = True
        left = list(self.user)
        self.user.clear()
        self.system.clear()
        while self.putters:
            waiter = self.putters.popleft()
            if not waiter.done():
                self.reserved += 1
                waiter.set_result(None)  # wakes the sender, which sees ``closed``
        return left


def _fail_waiter(waiter: asyncio.Future[None], error: Exception) -> None:
    if not waiter.done():
        waiter.set_exception(error)
