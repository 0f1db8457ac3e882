"""Asks answered at once: the handler runs in the asker's task, with no mailbox and no
future, when the actor is idle (``ActorCell.answer_at_once``).

This module holds what the asker and the actor's cell share about it: what the cell
answers besides a plain reply, and the bound on how long such asks may hold the loop.
"""

from __future__ import annotations

import asyncio
from typing import Final

#: How long asks answered at once may hold the loop back to back: past it, the next ask
#: goes through the mailbox, so its asker yields and other tasks get their turn.
AT_ONCE_STREAK_SECONDS = 2e-3

#: ``answer_at_once``'s answer when the ask must go through the mailbox.
NOT_AT_ONCE: Final = object()

#: ``answer_at_once``'s answer when only the at-once streak's bound stands in the way:
#: the ask goes through the mailbox of an idle actor, whose task then handles it first
#: thing in the next loop turn, ahead of the asker.
OVERDUE: Final = object()


class AtOnceFailure:
    """``answer_at_once``'s answer when the handler raised: the asker raises ``error``
    (the supervisor hears of it through the actor's system lane, as always)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class AtOnceStreak:
    """When the current run of asks answered at once began (None: the loop has turned
    since). One per actor system, so one per event loop.

    An ask answered at once never suspends its asker, so a caller asking in a tight
    loop would never let the loop turn. The run ends when an asker waits for a reply
    or when the loop runs the callback the run's first ask scheduled; the ask that
    finds it over ``AT_ONCE_STREAK_SECONDS`` goes through the mailbox (``OVERDUE``).
    That ask also turns concurrent askers from the latency path to the coalescing one:
    while it waits, every other ask queues behind it.
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
        if now - started > AT_ONCE_STREAK_SECONDS:
            self.started = None
            return False
        return True

    def end(self) -> None:
        self.started = None
