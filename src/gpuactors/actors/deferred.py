"""Deferred replies: answer an ask later without holding up the mailbox.

A handler that replies later has two ways to do it:

- **take its reply future** (``self.context.reply_future()``), keep it, settle it
  itself, and return None. This is the rule of the runtime: *one future per task*.
  For an ask it is the asker's own future (made on the spot for an ask answered at
  once, which has none yet), so the runtime makes no second future and links
  nothing. Settle it with ``if not future.done(): future.set_result(...)`` (or
  ``set_exception``): an asker that timed out or was cancelled has already settled
  it, and then settling is skipped. An exception set on it is the asker's error,
  never the actor's failure; cancelling it fails the ask with ActorStopped (the
  asker was not cancelled), as a cancelled Deferred does. A handler that takes the
  future and also returns anything but None has a bug: that is a ``TypeError``
  failure of the actor (its asker gets the TypeError). One that settles the future
  and then raises gives its asker what the future was settled with, on either path
  (at once or through the mailbox); the raise is still the actor's failure, for its
  supervisor, or, a GpuActorsError nobody can get now, logged as a warning. For a
  tell, the future is a fresh one that nobody awaits: settling it does nothing, an
  exception set on it is logged as a warning.
- **return a** :class:`Deferred` of a future of its own; the runtime links that
  future to the asker's (a second future and two callbacks per ask: fine off the hot
  path, and the only way when the future comes from elsewhere).

Either way the actor moves on to its next message at once. When the actor stops,
``post_stop`` may still settle what it owes; what is still pending after it fails its
ask with :class:`~gpuactors.errors.ActorStopped`. A restart ends the failed instance
the same way: what its ``pre_restart`` leaves pending fails with ActorStopped (the
fresh instance knows nothing of it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Deferred(Generic[T]):
    """A reply that is not ready yet, returned by a handler instead of the reply itself.

    A handler that makes the future itself saves a future and two callbacks per ask
    by taking its reply future instead (``context.reply_future()``: the module's
    docstring).

    The actor moves on to its next message at once; the ask resolves with the
    future's result or exception when the future completes. This is how an actor
    replies "when the GPU has finished" while it keeps accepting work. A cancelled
    future fails the ask with :class:`~gpuactors.errors.ActorStopped`. The future's
    failure belongs to the asker: supervision sees only what the handler raised.

    When the actor stops, ``post_stop`` may still complete or fail the futures it
    owes; those still pending after it fail their asks with ``ActorStopped``, as do
    those a restart's ``pre_restart`` leaves pending.
    """

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future[T]) -> None:
        if not isinstance(future, asyncio.Future):
            raise TypeError(f"Deferred wraps an asyncio.Future, not {type(future).__name__}")
        self.future = future

    def __repr__(self) -> str:
        return f"Deferred({self.future!r})"


def reply_from(future: asyncio.Future[T]) -> T | Deferred[T]:
    """The future's result if it has one already (a plain reply is cheaper to deliver),
    else a Deferred of it; a failed or cancelled future stays a Deferred, so its error
    reaches the asker without counting as the actor's failure."""
    if future.done() and not future.cancelled() and future.exception() is None:
        return future.result()
    return Deferred(future)


def failed_reply(error: BaseException) -> Deferred[Any]:
    """A reply that is the asker's error, not the actor's failure (supervision never sees it).

    A handler that fails its asker with a GpuActorsError simply raises it (the same
    rule); this is for other exceptions meant for the asker."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return Deferred(future)


class OwedReplies:
    """The reply futures handlers took, so that those still pending when the actor
    stops fail with ActorStopped. No callback per future (that is the saving): settled
    ones are dropped whenever the list has doubled since the last sweep."""

    __slots__ = ("_futures", "_sweep_at")

    _FIRST_SWEEP = 64

    def __init__(self) -> None:
        self._futures: list[asyncio.Future[Any]] = []
        self._sweep_at = self._FIRST_SWEEP

    def add(self, future: asyncio.Future[Any]) -> None:
        futures = self._futures
        futures.append(future)
        if len(futures) >= self._sweep_at:
            futures[:] = [owed for owed in futures if not owed.done()]
            self._sweep_at = max(self._FIRST_SWEEP, 2 * len(futures))

    @property
    def pending(self) -> int:
        return sum(1 for owed in self._futures if not owed.done())

    def fail_pending(self, error: Callable[[], Exception]) -> None:
        """Fail every future still pending with a fresh ``error()``; forget them all."""
        for owed in self._futures:
            if not owed.done():
                owed.set_exception(error())
        self._futures.clear()
