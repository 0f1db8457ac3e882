"""Asks answered at once: the handler runs in the asker's task, with no mailbox and no
future, when the actor is idle (``ActorCell.answer_at_once``).

This module holds what the asker and the actor's cell share about it: what the cell
answers besides a plain reply, and the bound on how long such asks may hold the loop.
"""

from __future__ import annotations

import asyncio
from typing import Final

from gpuactors.actors.loop_waiting import others_wait

#: How long asks answered at once may hold the loop back to back: past it, the next
#: ask's asker lets the loop turn before it takes its reply, so other tasks get theirs
#: (if none waits, the run goes on for another such stretch: ``loop_waiting``).
AT_ONCE_STREAK_SECONDS = 2e-3

#: ``answer_at_once``'s answer when the ask must go through the mailbox.
NOT_AT_ONCE: Final = object()


class AtOnceFailure:
    """``answer_at_once``'s answer when the handler raised: the asker raises ``error``
    (the supervisor hears of it through the actor's system lane, as always). It is an
    Exception: a handler's other BaseExceptions come wrapped in ActorFailed, as on the
    mailbox path (``cell.py`` says why)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class Overdue:
    """``answer_at_once``'s answer to the ask that found the at-once streak over its
    bound: handled at once all the same (so nothing sent after it overtakes it), its
    asker lets the loop turn once before it takes ``answer``, the handler's answer."""

    __slots__ = ("answer",)

    def __init__(self, answer: object) -> None:
        self.answer = answer


class AtOnceStreak:
    """When the current run of asks answered at once began (None: the loop has turned
    since). One per actor system, so one per event loop.

    An ask answered at once never suspends its asker, so a caller asking in a tight
    loop would never let the loop turn. The run ends when an asker waits for a reply
    or when the loop runs the callback the run's first ask scheduled. The ask that
    finds it over ``AT_ONCE_STREAK_SECONDS`` while something else waits for the loop
    (``loop_waiting.others_wait``) is answered at once all the same, but its asker then
    lets the loop turn (``Overdue``); if nothing waits, a new stretch begins. While
    that asker waits, every other ask to the actor queues in its mailbox: concurrent
    askers move from the latency path to the coalescing one. (Without that, 50
    concurrent engine clients stayed on the one-task-at-a-time path, at three times
    the p99: each found the engine idle.)
    """

    __slots__ = ("_end", "started")

    def __init__(self) -> None:
        self.started: float | None = None
        self._end: asyncio.Handle | None = None  # the callback that ends the run

    def admit(self, now: float, loop: asyncio.AbstractEventLoop) -> bool:
        """May one more ask be answered at once at ``now`` (perf_counter seconds)?"""
        started = self.started
        if started is None:
            self.started = now
            self._end = loop.call_soon(self.end)
            return True
        if now - started > AT_ONCE_STREAK_SECONDS:
            if not others_wait(loop, self._end):
                self.started = now  # nobody to let go first: a new stretch
                return True
            self.started = None
            return False
        return True

    def end(self) -> None:
        self.started = None
