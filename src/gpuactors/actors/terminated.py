"""Terminated: the notice a watcher receives when a watched actor has stopped."""

from __future__ import annotations

from gpuactors.actors.ref import ActorRef
from gpuactors.messages import Message


class Terminated(Message):
    """``ref`` (at ``path``) has stopped; ``cause`` is the failure that stopped it, if any.

    Delivered to watching actors as an ordinary message (declare
    ``@handles(Terminated)``), after the messages already in their mailbox and past
    its capacity, so it is never lost to backpressure.
    """

    ref: ActorRef
    path: str
    cause: BaseException | None = None
