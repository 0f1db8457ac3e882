"""Asks answered at once: the whole fast path, behind one switch.

An ask to an actor that is idle, with nothing queued and nobody else waiting on it,
runs a synchronous handler right away in the asker's task (:func:`answer_at_once`):
no mailbox, no task switch, no reply future. Nobody could tell the difference: the
actor's task would have run that handler next, start to end, with no other message
in between. The handler sees the actor's own context (logs, ``CURRENT_CELL``).

The switch is :attr:`Actor.answers_at_once <gpuactors.actors.Actor.answers_at_once>`
(default True): set it False on an actor whose handlers must run in its own task.
``async def`` handlers always go through the mailbox.

Such asks never suspend their asker, so a caller asking in a tight loop would never
let the loop turn. :class:`AtOnceStreak` bounds that: once asks answered at once have
held the loop for ``AT_ONCE_STREAK_SECONDS``, the next ask goes through the mailbox,
which lets the loop turn (timers, I/O, other tasks), and a new run begins once it
has. While an asker waits for its reply (``ActorCell.askers_waiting``), every other
ask to that actor queues behind it: concurrent askers move from the latency path to
the coalescing one, and nobody overtakes anybody.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Final

from gpuactors.actors.actor import resolve_handler

if TYPE_CHECKING:
    from gpuactors.actors.cell import ActorCell

#: How long asks answered at once may hold the loop back to back before the next one
#: goes through the mailbox (and so lets the loop turn).
AT_ONCE_STREAK_SECONDS = 2e-3

#: ``answer_at_once``'s answer when the ask must go through the mailbox.
NOT_AT_ONCE: Final = object()


class AtOnceFailure:
    """``answer_at_once``'s answer when the handler raised: the asker raises ``error``.

    A failure of the actor also reaches its supervisor (through the actor's system
    lane, as always); a :class:`~gpuactors.errors.GpuActorsError` raised for the asker
    only reaches the asker. It is an Exception: a handler's other BaseExceptions come
    wrapped in ActorFailed, as on the mailbox path (``cell.py`` says why)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class OwnReply:
    """``answer_at_once``'s answer when the handler took the asker's reply future
    (``ActorContext.reply_future``): the asker waits on ``future``, which the handler
    settles (or has settled already)."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future


class AtOnceStreak:
    """When the current run of asks answered at once began (None: the loop has turned
    since). One per actor system, so one per event loop.

    A run ends when an asker waits for a reply, or when the loop runs the callback
    the run's first ask scheduled (the loop turned, so everything else had its turn).
    """

    __slots__ = ("started",)

    def __init__(self) -> None:
        self.started: float | None = None

    def admit(self, now: float, loop: asyncio.AbstractEventLoop) -> bool:
        """May one more ask be answered at once at ``now`` (perf_counter seconds)?"""
        started = self.started
        if started is None:
            self.started = now
            loop.call_soon(self.end)
            return True
        if now - started <= AT_ONCE_STREAK_SECONDS:
            return True
        self.started = None  # past the bound: this ask goes through the mailbox
        return False

    def end(self) -> None:
        self.started = None


def answer_at_once(cell: ActorCell, message: Any, cid: int) -> Any:
    """Run the ask's handler now, in the asker's task, if nobody could tell.

    Returns the handler's reply; a :class:`~gpuactors.actors.Deferred` it returned;
    :class:`OwnReply` if it took its reply future; :class:`AtOnceFailure` if it raised;
    or ``NOT_AT_ONCE`` when the ask must go through the mailbox: the actor is busy,
    stopping, has anything queued or anyone waiting on it (concurrent asks coalesce
    better through the mailbox, and one asker must not overtake the others), the
    handler is async, the actor's switch is off, or the run is over its bound.
    """
    mailbox = cell.mailbox
    if (
        not cell.idle
        or cell.askers_waiting
        or cell.stopping
        or mailbox.user
        or mailbox.system
        or mailbox.putters  # senders waiting for room (or granted it) go first
        or mailbox.reserved
    ):
        return NOT_AT_ONCE
    handlers = cell.handlers
    message_type = type(message)
    handler = handlers.get(message_type) or resolve_handler(handlers, message_type)
    if handler is None or handler[1] or not cell.instance.answers_at_once:
        return NOT_AT_ONCE
    context = cell.task_context
    if context is None:
        return NOT_AT_ONCE
    streak = cell.system.at_once
    started = streak.started
    now = time.perf_counter()
    # Within a run (the common case) in one comparison; admit() begins or ends one.
    if (started is None or now - started > AT_ONCE_STREAK_SECONDS) and not streak.admit(
        now, cell.loop
    ):
        return NOT_AT_ONCE
    cell.idle = False
    try:
        return context.run(cell.handle_at_once, handler[0], message, cid)
    finally:
        cell.idle = not (cell.stopping or mailbox.system)
