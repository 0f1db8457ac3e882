"""ActorContext: what an actor can do besides handling messages."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from gpuactors.actors.actor import Actor
from gpuactors.actors.props import Props
from gpuactors.actors.ref import ActorRef, cell_of
from gpuactors.errors import InvalidArgument

if TYPE_CHECKING:
    from gpuactors.actors.cell import ActorCell
    from gpuactors.actors.system import ActorSystem


class ActorContext:
    """An actor's link to the runtime: its place in the tree, children, and watches.

    The same context serves every incarnation of the actor, across restarts.
    """

    __slots__ = ("_cell",)

    def __init__(self, cell: ActorCell) -> None:
        self._cell = cell

    @property
    def self_ref(self) -> ActorRef:
        """This actor's own ref (to give to others, or to tell itself)."""
        return self._cell.ref

    @property
    def system(self) -> ActorSystem:
        """The system this actor lives in."""
        return self._cell.system

    @property
    def parent(self) -> ActorRef | None:
        """The parent's ref; None for a top-level actor."""
        parent = self._cell.parent
        return None if parent is None else parent.ref

    @property
    def children(self) -> tuple[ActorRef, ...]:
        """Live children, oldest first."""
        return tuple(child.ref for child in self._cell.children.values())

    @property
    def log(self) -> structlog.typing.FilteringBoundLogger:
        """A logger bound to the system and this actor's path."""
        return self._cell.log

    def reply_future(self) -> asyncio.Future[Any]:
        """The reply future of the message being handled, for the handler to settle
        itself later (one future per task: ``deferred.py`` has the whole rule).

        For an ask it is the asker's own future; for an ask answered at once, which has
        none yet, one is made now and the asker waits on it. The handler must then
        return None. Settle it only ``if not future.done()``: an asker that timed out
        or was cancelled has settled it already. For a tell, it is a fresh future
        nobody awaits (an exception set on it is logged). Calling it again in the same
        handler returns the same future. A task the running handler started (``gather``,
        ``wait_for``) may take it too; calling it outside a handler of this actor, from
        another task (a callback, another actor's), or from a task an earlier handler or
        a hook of this actor started and left running (it would take a later message's
        future) raises :class:`~gpuactors.errors.ActorError`: take it in the handler and
        hand it over.
        """
        return self._cell.take_reply()

    def spawn(self, target: type[Actor] | Props, name: str | None = None) -> ActorRef:
        """Start a child, supervised by this actor and stopped before it."""
        return self._cell.system._spawn(target, name, parent=self._cell)

    def stop(self, ref: ActorRef) -> None:
        """Ask this actor or one of its children to stop, after its current message.

        Returns at once (a handler must not wait for itself); watch the ref to learn
        when it has stopped.
        """
        target = cell_of(ref, "stop")
        if target is not self._cell and target.parent is not self._cell:
            raise InvalidArgument(
                f"{self._cell.path} can stop itself or its children, not {target.path}; "
                "use ActorSystem.stop"
            )
        target.request_stop()

    def watch(self, ref: ActorRef) -> ActorRef:
        """Receive ``Terminated`` when ``ref`` stops (at once if it already has): one
        notice per watch, however often it is asked before that notice is taken."""
        cell_of(ref, "watch").add_watcher(self._cell)
        return ref

    def unwatch(self, ref: ActorRef) -> None:
        """Stop watching ``ref``: no ``Terminated`` for it arrives after this, not even
        one already waiting in the mailbox (its actor stopped just before)."""
        cell_of(ref, "unwatch").remove_watcher(self._cell)
