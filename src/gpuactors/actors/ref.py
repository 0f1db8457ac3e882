"""ActorRef: the handle through which everything talks to an actor."""

from __future__ import annotations

import asyncio
import itertools
import math
from typing import TYPE_CHECKING, Any, TypeVar, overload

from gpuactors.actors.at_once import NOT_AT_ONCE, AtOnceFailure, OwnReply, answer_at_once
from gpuactors.actors.checks import seconds
from gpuactors.actors.deadlines import Deadline, expire
from gpuactors.actors.deferred import Deferred
from gpuactors.actors.mailbox import Backpressure, Envelope
from gpuactors.errors import ActorStopped, AskTimeout, InvalidArgument, MailboxFull
from gpuactors.messages import Message

if TYPE_CHECKING:
    from gpuactors.actors.cell import ActorCell

R = TypeVar("R")

#: Correlation ids: a number, unique in this process, that follows each ask through the
#: logs (``correlation_id``). Drawn where the ask starts; not formatted (a string per
#: ask cost the latency path 0.1 to 0.3 us).
_next_id = itertools.count(1).__next__

_INF = math.inf


class ActorRef:
    """A stable handle to one actor: it outlives restarts, and is cheap to pass around.

    ``tell`` never waits; ``tell_wait`` and ``ask`` honour the mailbox's backpressure
    policy. Use a ref only from its system's event loop.
    """

    __slots__ = ("_cell",)

    def __init__(self, cell: ActorCell) -> None:
        self._cell = cell

    @property
    def path(self) -> str:
        """Where the actor lives in the tree, e.g. ``/gpu0/compiler``."""
        return self._cell.path

    @property
    def name(self) -> str:
        """The last segment of the path; unique among siblings."""
        return self._cell.name

    @property
    def is_alive(self) -> bool:
        """False once the actor has fully stopped."""
        return not self._cell.terminated.done()

    def __repr__(self) -> str:
        return f"ActorRef({self._cell.path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorRef) and other._cell is self._cell

    def __hash__(self) -> int:
        return hash(self._cell.path)

    # -------------------------------------------------------------------- sends
    def tell(self, message: Message) -> None:
        """Queue ``message`` without waiting for a reply.

        Raises :class:`MailboxFull` if the mailbox has no room (whatever its policy:
        ``tell`` cannot wait; use :meth:`tell_wait`). A stopped actor's messages go to
        dead letters.
        """
        cell = self._cell
        if cell.mailbox.offer((message, None, None)):
            return
        if cell.mailbox.closed:
            cell.dead_letter(message, "stopped")
            return
        raise MailboxFull(f"{cell.path}: mailbox full ({cell.mailbox.capacity} messages)")

    async def tell_wait(self, message: Message, timeout: float | None = None) -> None:
        """Queue ``message``, waiting for room under the ``WAIT`` policy.

        Raises :class:`MailboxFull` under ``FAIL``, or if still full after ``timeout``
        (seconds, as for :meth:`ask`).
        """
        if timeout is not None:
            timeout = seconds(timeout, "tell_wait timeout")
        envelope: Envelope = (message, None, None)
        if not self._cell.mailbox.offer(envelope):
            await self._send_slow(envelope, timeout)

    @overload
    async def ask(self, message: Message, timeout: float | None = None) -> Any: ...

    @overload
    async def ask(
        self, message: Message, timeout: float | None = None, *, expect: type[R]
    ) -> R: ...

    async def ask(
        self, message: Message, timeout: float | None = None, *, expect: type[Any] | None = None
    ) -> Any:
        """Send ``message`` and return the handler's reply (or raise its exception).

        ``timeout`` (seconds, None for no limit) covers waiting for mailbox room and
        the reply: :class:`AskTimeout` when it runs out. It must be a finite number
        above 0, checked before anything is sent (InvalidArgument). ``expect`` checks
        and types the reply. Cancelling the caller leaves nothing behind: an unhandled
        message is skipped, a late reply dropped. Once the ask is over, the runtime
        holds its reply no longer, nor its message but for one case: an ask given up
        (timed out, cancelled) while its message still waits in the mailbox leaves it
        there, holding its place and its slot of the capacity, until the actor reaches
        it and skips it unhandled, as a queue of mail does.
        """
        if timeout is not None and not (type(timeout) is float and 0.0 < timeout < _INF):
            timeout = seconds(timeout, "ask timeout")  # (NaN fails the comparison above)
        if expect is not None and not isinstance(expect, type):
            raise InvalidArgument(f"ask's expect must be a class, not {expect!r}")
        cell = self._cell
        cid = _next_id()
        # An idle actor answers at once, in this task: no mailbox round trip, no future.
        answer = answer_at_once(cell, message, cid)
        timer: asyncio.TimerHandle | None = None
        deadline: Deadline | None = None
        if answer is NOT_AT_ONCE:
            reply: asyncio.Future[Any] = cell.loop.create_future()
            envelope: Envelope = (message, reply, cid)
            if cell.mailbox.offer(envelope):
                if timeout is not None:
                    deadline = cell.deadlines.add(reply, envelope, timeout)
            else:
                timer = await self._send_slow(envelope, timeout)
        elif type(answer) is OwnReply:  # the handler took the future it settles
            reply = answer.future
            if timeout is not None and not reply.done():
                deadline = cell.deadlines.add(reply, (message, reply, cid), timeout)
        elif isinstance(answer, Deferred):  # answered at once, the reply still to come
            settled = answer.future
            if settled.done() and not settled.cancelled() and settled.exception() is None:
                result = settled.result()
                return result if expect is None else _checked(result, message, expect, cell.path)
            reply = cell.loop.create_future()
            cell.defer_reply(settled, reply)
            if timeout is not None and not reply.done():
                deadline = cell.deadlines.add(reply, (message, reply, cid), timeout)
        elif type(answer) is AtOnceFailure:
            raise answer.error
        else:
            return answer if expect is None else _checked(answer, message, expect, cell.path)
        try:
            if reply.done():  # a reply settled at once (deferred or taken)
                result = reply.result()
            else:
                cell.system.at_once.end()  # this asker yields: the loop turns
                cell.askers_waiting += 1
                try:
                    result = await reply
                finally:
                    cell.askers_waiting -= 1
        except BaseException as exc:
            if not reply.done():
                reply.cancel()
            else:
                if not reply.cancelled():
                    reply.exception()  # mark retrieved: the caller went away
                if isinstance(exc, asyncio.CancelledError) and not _asker_cancelled():
                    # The reply future was cancelled, or failed with a CancelledError (a
                    # taken future's, a Deferred's); the asker was not cancelled, so it
                    # must not unwind as if it were.
                    raise ActorStopped(
                        f"{cell.path}: the reply to {type(message).__name__} was cancelled "
                        f"(correlation id {cid})"
                    ) from None
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if deadline is not None:  # the ask is over: its deadline lets go of it
                cell.deadlines.settle(deadline)
        return result if expect is None else _checked(result, message, expect, cell.path)

    async def _send_slow(
        self, envelope: Envelope, timeout: float | None
    ) -> asyncio.TimerHandle | None:
        """The mailbox is full or closed: wait for room, fail fast or dead-letter.

        For an ask, returns the timer that enforces what is left of its timeout (a
        one-off timer: the shared per-timeout queues need asks in deadline order).
        """
        cell = self._cell
        mailbox = cell.mailbox
        message, reply, cid = envelope
        if not mailbox.closed:
            if mailbox.policy is Backpressure.FAIL:
                raise MailboxFull(f"{cell.path}: mailbox full ({mailbox.capacity} messages)")
            loop = cell.loop
            started = loop.time()
            on_timeout: Exception = (
                MailboxFull(f"{cell.path}: mailbox still full after {timeout}s")
                if reply is None
                else AskTimeout(
                    f"{cell.path}: no room for {type(message).__name__} within {timeout}s "
                    f"(correlation id {cid})"
                )
            )
            if await mailbox.put(envelope, timeout, on_timeout):
                if reply is None or timeout is None:
                    return None
                return loop.call_at(started + timeout, expire, reply, cell.path, envelope, timeout)
        cell.dead_letter(message, "stopped")
        if reply is None:
            return None
        raise ActorStopped(f"{cell.path} has stopped; {type(message).__name__} was not handled")


def _asker_cancelled() -> bool:
    """Was the asking task cancelled (rather than its reply future)? Python 3.10
    cannot tell the two apart: there, assume the task was."""
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling is None or bool(cancelling())


def cell_of(ref: object, what: str) -> ActorCell:
    """The cell behind ``ref``, or InvalidArgument naming ``what`` wanted a ref."""
    if not isinstance(ref, ActorRef):
        raise InvalidArgument(f"{what} takes an ActorRef, not {ref!r}")
    return ref._cell


def _checked(result: Any, message: Message, expect: type[Any], path: str) -> Any:
    if not isinstance(result, expect):
        raise TypeError(
            f"{path} replied {type(result).__name__} to {type(message).__name__}, "
            f"expected {expect.__name__}"
        )
    return result
