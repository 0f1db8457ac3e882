"""Deferred replies: answer an ask later without holding up the mailbox."""

from __future__ import annotations

import asyncio
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Deferred(Generic[T]):
    """A reply that is not ready yet, returned by a handler instead of the reply itself.

    The actor moves on to its next message at once; the ask resolves with the
    future's result or exception when the future completes. This is how an actor
    replies "when the GPU has finished" while it keeps accepting work. A cancelled
    future fails the ask with :class:`~gpuactors.errors.ActorStopped`. The future's
    failure belongs to the asker: supervision sees only what the handler raised.

    When the actor stops, ``post_stop`` may still complete or fail the futures it
    owes; those still pending after it fail their asks with ``ActorStopped``.
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
    """A reply that is the asker's error, not the actor's failure (supervision never sees it)."""
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return Deferred(future)
