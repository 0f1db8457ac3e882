"""ActorCell: the runtime behind one actor (its task, mailbox, children and lifecycle).

One long-lived task per actor takes envelopes from the mailbox and calls the
handlers one at a time, in the task itself (no task per message). The cell
outlives the actor instances it builds: a restart swaps the instance and keeps the
mailbox, the ref, the context and the watchers.

Stopping, in order: the current message finishes (if it fails, the actor is not
restarted: a fresh instance would only be stopped); the mailbox closes (queued
messages go to dead letters, their askers get ``ActorStopped``); children stop,
youngest first, within the system's ``shutdown_timeout``: past it the stragglers are
cancelled (each logged) and the stop goes on, so a child whose stop hangs never holds
its parent's for good; ``post_stop`` runs, the place to finish or fail work in flight;
deferred replies still pending then fail with ``ActorStopped``; watchers get
``Terminated``. A killed cell (stop timeout) goes through the same steps, its
current handler cancelled. A restart stops the children first too, bounded the same
way. One bound covers a whole subtree: where the actor's stop is bounded from above
already (``ActorSystem.stop`` or ``shutdown`` and its timeout, or an ancestor waiting
for its children), that bound alone applies, and its kill cancels the whole subtree.
A bound already running when a longer one arrives from above keeps running.
A dead-letter subscriber's KeyboardInterrupt or SystemExit cuts none of this short:
the actor stops, then its task (or whoever ran ``_finalize``) re-raises it.

What the actor's own code raises (a handler, on either path, a lifecycle hook, or
its supervisor's decider or ``supervisor_strategy``) is one of four things:

- a :class:`~gpuactors.errors.GpuActorsError` raised by a handler: its asker's
  error, not the actor's failure. The asker gets it as it is; the supervisor never
  hears of it (no restart); for a tell, nobody can get it, so it is logged as a
  warning. A handler needs no try/except to refuse a bad request;

- the end of the actor's task, not a failure: the task's own cancellation (stop
  timeout, loop shutdown), or its coroutine being closed by the garbage collector;
- ``KeyboardInterrupt`` or ``SystemExit``, a request to end the process: the asker
  gets :class:`ActorFailed` (its ``__cause__`` the original), the supervisor is not
  asked, the actor stops (children, ``post_stop``, ``Terminated.cause`` that
  ActorFailed), and then its task re-raises the original, which leaves the event
  loop as it would from any task;
- anything else is a failure, which the supervisor handles: an ``Exception`` as it
  is, any other ``BaseException`` (``GeneratorExit``, a library's own, a
  ``CancelledError`` the handler raised itself) as an ``ActorFailed`` that names it,
  so the asker always gets a typed error and never a ``GeneratorExit``.

A handler that returns a coroutine (an async call it forgot to await) fails the same
way, with an ActorFailed that names it; the coroutine is closed unrun.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextvars import ContextVar
from functools import partial
from types import CoroutineType
from typing import TYPE_CHECKING, Any

import structlog

from gpuactors.actors.actor import (
    CONSTRUCTING,
    Actor,
    bind_handlers,
    handled_types,
    resolve_handler,
)
from gpuactors.actors.at_once import AtOnceFailure, OwnReply
from gpuactors.actors.context import ActorContext
from gpuactors.actors.dead_letters import DeadLetter, DeadLetterReason
from gpuactors.actors.deadlines import AskDeadlines
from gpuactors.actors.deferred import Deferred, OwedReplies
from gpuactors.actors.mailbox import Envelope, Mailbox
from gpuactors.actors.props import Props
from gpuactors.actors.ref import ActorRef
from gpuactors.actors.supervision import Directive, RestartBudget, SupervisorStrategy
from gpuactors.actors.terminated import Terminated
from gpuactors.errors import (
    ActorError,
    ActorFailed,
    ActorStopped,
    GpuActorsError,
    ShutdownTimeout,
    UnhandledMessage,
)
from gpuactors.logs import get_logger

if TYPE_CHECKING:
    from gpuactors.actors.system import ActorSystem


def _structlog_var(key: str) -> ContextVar[Any]:
    """structlog's own context variable for ``key``, so a plain ``set`` binds it cheaply."""
    token = structlog.contextvars.bind_contextvars(**{key: ...})[key]
    token.var.reset(token)
    return token.var


_MESSAGE_TYPE = _structlog_var("message_type")
_CORRELATION_ID = _structlog_var("correlation_id")


#: The cell whose task is running (None outside actors).
CURRENT_CELL: ContextVar[ActorCell | None] = ContextVar("gpuactors_current_cell", default=None)

#: Which async handler run of its cell this context was set in (``ActorCell.handler_run``;
#: 0: none yet). A task a handler starts copies it, which tells a task of the running
#: handler from one an earlier handler (or a hook) left running.
HANDLER_RUN: ContextVar[int] = ContextVar("gpuactors_handler_run", default=0)

_STOP = object()

#: ``ActorCell.reply`` between handlers, and while an ask answered at once has no future.
_OUTSIDE = object()
_AT_ONCE = object()

#: Messages handled back to back before the actor lets other tasks run.
_FAIR_BURST = 256


class _HandledAtOnceFailed:
    """System signal: a handler run in its asker's task raised; supervise it here."""

    __slots__ = ("cid", "error", "message")

    def __init__(self, error: BaseException, message: Any, cid: int) -> None:
        self.error = error
        self.message = message
        self.cid = cid


class _ChildFailed:
    """System signal: a child escalated ``error``; the parent fails with it."""

    __slots__ = ("child", "error")

    def __init__(self, child: ActorCell, error: BaseException) -> None:
        self.child = child
        self.error = error


class _DeferredLink:
    """Forwards a Deferred's outcome to its asker; counted while someone still waits."""

    __slots__ = ("cell", "forwarded", "future", "reply")

    def __init__(
        self, cell: ActorCell, future: asyncio.Future[Any], reply: asyncio.Future[Any] | None
    ) -> None:
        self.cell = cell
        self.future = future
        self.reply = reply
        self.forwarded = False

    def on_result(self, future: asyncio.Future[Any]) -> None:
        self.cell.links.discard(self)
        if not self.forwarded:
            self.forwarded = True
            _forward(future, self.reply, self.cell)

    def on_reply_done(self, reply: asyncio.Future[Any]) -> None:
        # The asker has its answer or is gone (timeout, cancel): nobody waits any more.
        # ``on_result`` stays attached so the future's outcome is still consumed.
        self.cell.links.discard(self)


def _forward(
    future: asyncio.Future[Any], reply: asyncio.Future[Any] | None, cell: ActorCell
) -> None:
    """Copy a deferred future's outcome to the asker's future (dropped if it is gone)."""
    error: BaseException | None
    if future.cancelled():
        error = ActorStopped(f"{cell.path}: the deferred reply was cancelled")
    else:
        error = future.exception()
    if reply is None:
        if error is not None and not future.cancelled():
            cell.log.warning("deferred reply of a tell failed", exc_info=error)
    elif not reply.done():
        if error is None:
            reply.set_result(future.result())
        else:
            reply.set_exception(error)


def _task_is_cancelled() -> bool:
    """Was the current task cancelled (rather than a handler raising CancelledError)?

    Python 3.10 cannot tell the two apart: there, assume the task was cancelled.
    """
    cancelling = getattr(asyncio.current_task(), "cancelling", None)
    return cancelling is None or bool(cancelling())


async def _settled_replies_delivered() -> None:
    """One loop turn: the replies a hook settled through its futures' done-callbacks (a
    Drain answered once its tasks are failed, say) reach their askers before what is
    still owed fails."""
    await asyncio.sleep(0)


async def _settle_hook(result: Awaitable[None] | None) -> None:
    if result is not None and inspect.isawaitable(result):
        await result


def run_each(steps: Iterable[Callable[[], None]]) -> None:
    """Run every step, even past one that asks the process to end (a dead-letter
    subscriber's KeyboardInterrupt or SystemExit): the first such request is re-raised
    once all have run, so that no cleanup is skipped on the way out."""
    exit_request: BaseException | None = None
    for step in steps:
        try:
            step()
        except (KeyboardInterrupt, SystemExit) as raised:
            if exit_request is None:
                exit_request = raised
    if exit_request is not None:
        raise exit_request


async def stop_in_order(cells: Sequence[ActorCell]) -> None:
    """Stop ``cells`` one after another, the last first, each waited for until it ends."""
    for cell in reversed(cells):
        cell.request_stop()
        await asyncio.wait((cell.terminated,))  # never cancels the shared future


@contextlib.contextmanager
def bounding_stops(roots: Iterable[ActorCell]) -> Iterator[None]:
    """Mark ``roots`` as stopping under a timeout (``ActorSystem._stop_within``) while
    it lasts: their descendants' stops wait for that timeout rather than add their own."""
    marked = tuple(roots)
    for root in marked:
        root.stop_bounds += 1
    try:
        yield
    finally:
        for root in marked:
            root.stop_bounds -= 1


class ActorCell:
    """Runs one actor: processing loop, supervision of its failures, stop sequence."""

    def __init__(
        self, system: ActorSystem, props: Props, name: str, parent: ActorCell | None
    ) -> None:
        self.system = system
        self.props = props
        self.name = name
        self.parent = parent
        self.path: str = f"{parent.path}/{name}" if parent is not None else f"/{name}"
        self.loop = system.loop
        self.mailbox = Mailbox(props.mailbox, self.loop)
        self.deadlines = AskDeadlines(self.loop, self.path)
        self.ref = ActorRef(self)
        self.context = ActorContext(self)
        self.log = get_logger(system=system.name, actor=self.path)
        self.children: dict[str, ActorCell] = {}
        self.watchers: set[ActorCell] = set()
        self.watching: set[ActorCell] = set()
        #: ``watch_future``'s futures, in order (a dict: one given up leaves at once).
        self.waiters: dict[asyncio.Future[Terminated], None] = {}
        self.links: set[_DeferredLink] = set()
        #: Reply futures handlers took (``take_reply``), failed if still pending at stop.
        self.owed_replies = OwedReplies()
        #: The running handler's reply future: None for a tell, ``_AT_ONCE`` for an ask
        #: answered at once before the handler takes one, ``_OUTSIDE`` between handlers.
        self.reply: asyncio.Future[Any] | object | None = _OUTSIDE
        #: Whether the running handler took ``reply`` (then it settles it, not the cell).
        self.reply_taken = False
        #: Whether it took it running in line (read only while ``reply_taken``).
        self.taken_in_line = False
        #: Counts the async handler runs; ``HANDLER_RUN`` holds the latest one in the
        #: task's context (see ``_check_handlers_task``).
        self.handler_run = 0
        self.restarts = RestartBudget()
        self.terminated: asyncio.Future[None] = self.loop.create_future()
        #: How many stops bounded by a timeout (``bounding_stops``) cover this cell's
        #: subtree now: then that timeout, not this cell's own, bounds its children's stop.
        self.stop_bounds = 0
        self.cause: BaseException | None = None
        self.stopping = False
        #: True while the task waits for mail with nothing queued: see ``answer_at_once``.
        self.idle = False
        #: Asks to this actor whose askers wait for the reply (queued or deferred).
        self.askers_waiting = 0
        self.task: asyncio.Task[None] | None = None
        #: The task's context, where ``at_once.answer_at_once`` runs handlers too.
        self.task_context: contextvars.Context | None = None
        self._killed = False
        #: A KeyboardInterrupt or SystemExit the actor's code raised: re-raised once the
        #: actor has stopped (see the module's docstring).
        self._exit: BaseException | None = None
        self._started = False
        self._suspension: asyncio.Future[Directive] | None = None
        try:
            self.instance: Actor = self._new_instance()
        except BaseException as exc:
            self.cause = exc
            self._end_unstarted()
            raise
        self.handlers = bind_handlers(self.instance)

    @property
    def pending_deferred(self) -> int:
        """Deferred replies still owed to someone waiting (or to a tell), and reply
        futures handlers took and have not settled."""
        return len(self.links) + self.owed_replies.pending

    def is_within(self, root: ActorCell) -> bool:
        """True if this cell is ``root`` or one of its descendants."""
        cell: ActorCell | None = self
        while cell is not None:
            if cell is root:
                return True
            cell = cell.parent
        return False

    # ------------------------------------------------------------------- control
    def start(self) -> None:
        # The task runs in a context the cell holds, so a handler run at once (in an
        # asker's task) runs in it too: it sees and sets what the actor's task would.
        # (Python 3.10 cannot give a task a context: there, every ask uses the mailbox.)
        name = f"actor {self.path}"
        if sys.version_info >= (3, 11):
            self.task_context = contextvars.copy_context()
            self.task = self.loop.create_task(self._run(), name=name, context=self.task_context)
        else:
            self.task = self.loop.create_task(self._run(), name=name)
        self.task.add_done_callback(self._on_task_done)

    def request_stop(self) -> None:
        """Stop after the current message (idempotent, never waits)."""
        if self.stopping:
            return
        self.stopping = True
        self.mailbox.signal(_STOP)
        if self._suspension is not None and not self._suspension.done():
            self._suspension.set_result(Directive.STOP)

    def resume(self) -> None:
        """Let a child suspended by its escalation go on (its parent resumed)."""
        if self._suspension is not None and not self._suspension.done():
            self._suspension.set_result(Directive.RESUME)

    def kill(self) -> None:
        """Cancel the task (shutdown timeout): the stop sequence runs without waiting."""
        self._killed = True
        self.stopping = True
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def dead_letter(self, message: Any, reason: DeadLetterReason) -> None:
        self.system.dead_letters.publish(DeadLetter(message, self.path, reason))

    def add_watcher(self, watcher: ActorCell) -> None:
        """Send ``watcher`` one Terminated when this actor stops (at once if it has).

        Idempotent until that notice is taken, stopped or not: a notice already waiting
        in the watcher's mailbox answers a second watch too (a scan of that mailbox,
        only when watching an actor that has stopped)."""
        if watcher is self:
            return
        if self.terminated.done():
            if not any(map(self._is_my_notice, watcher.mailbox.user)):
                watcher.mailbox.force((self._notice(), None, None))
            return
        self.watchers.add(watcher)
        watcher.watching.add(self)

    def remove_watcher(self, watcher: ActorCell) -> None:
        self.watchers.discard(watcher)
        watcher.watching.discard(self)
        if self.terminated.done():  # its notice may wait in the watcher's mailbox already
            watcher.mailbox.drop(self._is_my_notice)

    def _is_my_notice(self, envelope: Envelope) -> bool:
        """Is ``envelope`` the runtime's Terminated notice of this actor?"""
        notice = envelope[0]
        return envelope[1] is None and isinstance(notice, Terminated) and notice.ref == self.ref

    def watch_future(self) -> asyncio.Future[Terminated]:
        waiter: asyncio.Future[Terminated] = self.loop.create_future()
        if self.terminated.done():
            waiter.set_result(self._notice())
        else:
            # A watcher that gives up (wait_for, a cancel) must not leave its future
            # here for the rest of the actor's life.
            self.waiters[waiter] = None
            waiter.add_done_callback(self._forget_waiter)
        return waiter

    def _forget_waiter(self, waiter: asyncio.Future[Terminated]) -> None:
        self.waiters.pop(waiter, None)

    # ---------------------------------------------------------------- the task
    async def _run(self) -> None:
        CURRENT_CELL.set(self)
        HANDLER_RUN.set(0)  # (not its spawner's run: this actor counts its own from 0)
        structlog.contextvars.bind_contextvars(system=self.system.name, actor=self.path)
        try:
            try:
                if await self._start():
                    await self._process()
            except asyncio.CancelledError:
                if not self._killed:
                    raise
                self._uncancel()
            await self._wind_down()
        except asyncio.CancelledError:
            if not self._killed:
                raise
        finally:
            self._finalize()
        if self._exit is not None:
            raise self._exit

    async def _start(self) -> bool:
        try:
            await _settle_hook(self.instance.pre_start())
        except BaseException as exc:
            if self._ends_the_task(exc):
                raise
            self.cause = self._as_failure(exc, "pre_start")
            self.log.error("pre_start failed; stopping", exc_info=exc)
            return False
        self._started = True
        self.log.debug("actor started")
        return True

    async def _process(self) -> None:
        """Handle messages one at a time until told to stop (the hot path)."""
        mailbox = self.mailbox
        user = mailbox.user
        system = mailbox.system
        putters = mailbox.putters
        set_type = _MESSAGE_TYPE.set
        set_cid = _CORRELATION_ID.set
        set_run = HANDLER_RUN.set
        burst = 0
        while True:
            if system:
                if await self._on_signal(system.popleft()):
                    return
                continue
            if not user:
                if mailbox.closed:  # killed while a handler ran on: nothing will come
                    return
                burst = 0
                # Nothing of the last message may outlive its reply while the actor waits.
                message = reply = result = None
                self.idle = True
                try:
                    await mailbox.wait()
                finally:
                    self.idle = False
                continue
            if burst == _FAIR_BURST:  # a long queue must not starve the other tasks
                burst = 0
                await asyncio.sleep(0)
                continue
            burst += 1
            message, reply, cid = user.popleft()
            if putters:  # (one more comparison, only while senders wait for room)
                mailbox.pass_on_room()
            if reply is not None and reply.done():
                continue  # the asker is gone (cancelled or timed out): skip the message
            message_type = type(message)
            handler = self.handlers.get(message_type) or resolve_handler(
                self.handlers, message_type
            )
            if handler is None:
                self._unhandled(message, reply)
                continue
            set_type(message_type.__name__)
            set_cid(... if cid is None else cid)
            method, is_async = handler
            self.reply = reply
            try:
                result = method(message)
                if is_async:
                    # Only a suspended handler lets other tasks run meanwhile, so only an
                    # async run needs its own number (a synchronous one, ~0.2 us, is spared).
                    # Set in the task's own context: no reset, the next run overwrites it.
                    self.handler_run += 1
                    set_run(self.handler_run)
                    result = await result
            except BaseException as exc:  # the module's docstring says what becomes of it
                taken = self._end_handler()
                if self._ends_the_task(exc):
                    if reply is not None and not reply.done():
                        reply.set_exception(self._stopped_error(message))
                    raise
                if isinstance(exc, GpuActorsError):  # the asker's error, not a failure
                    self._fail_ask(exc, reply if taken is None else taken, message)
                    continue
                if await self._handler_failed(exc, message, reply):
                    return
                continue
            if self.reply_taken:  # the handler settles its reply future itself
                self._end_handler()
                if result is not None and await self._handler_failed(
                    self._returned_too(result, message), message, reply
                ):
                    return
                continue
            self.reply = _OUTSIDE
            if isinstance(result, Deferred):
                self.defer_reply(result.future, reply)
            elif type(result) is CoroutineType:  # an async call it forgot to await
                if await self._handler_failed(
                    self._unawaited(result, method, message), message, reply
                ):
                    return
            elif reply is not None and not reply.done():
                reply.set_result(result)

    def handle_at_once(self, method: Callable[[Any], Any], message: Any, cid: int) -> Any:
        """Run a handler for ``at_once.answer_at_once`` (in the actor's context) and
        say what the asker gets: the reply, ``OwnReply`` or ``AtOnceFailure``."""
        _MESSAGE_TYPE.set(type(message).__name__)
        _CORRELATION_ID.set(cid)
        self.reply = _AT_ONCE
        try:
            result = method(message)
        except BaseException as exc:  # all of it is the handler's here: it raised it
            taken = self._end_handler()
            if taken is not None and not taken.done():  # unsettled: the raise wins
                taken.cancel()  # made here, never seen by the asker
                taken = None
            # A future settled before the raise is the asker's answer, as on the mailbox
            # path; the raise is still the actor's failure (or logged, if the asker's).
            if isinstance(exc, GpuActorsError):  # the asker's error, not the actor's failure
                if taken is None:
                    return AtOnceFailure(exc)
                self._fail_ask(exc, taken, message)
                return OwnReply(taken)
            failure = self._as_failure(exc, f"handler of {type(message).__name__}")
            # First in the system lane: ahead of a stop the handler may have asked for,
            # as on the mailbox path, where the supervisor hears of a failure at once.
            self.mailbox.signal(_HandledAtOnceFailed(failure, message, cid), first=True)
            return AtOnceFailure(failure) if taken is None else OwnReply(taken)
        taken = self._end_handler()
        if taken is None:
            if type(result) is not CoroutineType:  # (one check: this is the latency path)
                return result
            failure = self._unawaited(result, method, message)
            self.mailbox.signal(_HandledAtOnceFailed(failure, message, cid), first=True)
            return AtOnceFailure(failure)
        if result is not None:
            failure = self._returned_too(result, message)
            if not taken.done():
                taken.set_exception(failure)
            self.mailbox.signal(_HandledAtOnceFailed(failure, message, cid), first=True)
        return OwnReply(taken)

    # ----------------------------------------------------------- reply futures
    def take_reply(self) -> asyncio.Future[Any]:
        """The running handler's reply future, now the handler's to settle (see
        ``ActorContext.reply_future``).

        Only the handler itself may take it. One running in line (``at_once.py``) is
        synchronous, so nothing else runs meanwhile; one in the actor's task may be
        suspended, and then another task could call this: the caller's task is checked
        here, off the ask's path, which costs asks that never take their future nothing.
        """
        reply = self.reply
        if self.reply_taken:
            if not self.taken_in_line:
                self._check_handlers_task()
            return reply  # type: ignore[return-value]
        taken: asyncio.Future[Any]
        if reply is _AT_ONCE:  # the asker has none yet: it waits on this one
            taken = self.loop.create_future()
            self.owed_replies.add(taken)
            self.taken_in_line = True
        elif reply is _OUTSIDE:
            raise ActorError(
                f"{self.path}: reply_future() is for a handler of this actor, while it "
                "runs (not a lifecycle hook, another task or a callback)"
            )
        else:
            self._check_handlers_task()
            if isinstance(reply, asyncio.Future):  # the asker's own, from the mailbox
                taken = reply
                self.owed_replies.add(taken)
            else:  # a tell: nobody waits; a failure is only logged
                taken = self.loop.create_future()
                taken.add_done_callback(self._tell_reply_done)
            self.taken_in_line = False
        self.reply = taken
        self.reply_taken = True
        return taken

    def _check_handlers_task(self) -> None:
        """The caller must be this actor's task, or a task the running handler started
        (which runs in a copy of its context: ``asyncio.wait_for`` runs its coroutine in
        a task of its own before Python 3.12, ``gather`` always), not a task an earlier
        handler or a hook of this actor left running, another actor's, nor code outside
        any actor. A synchronous handler runs start to end with no other task between
        (those run in line never get here), so only async runs are numbered."""
        try:
            current = asyncio.current_task()
        except RuntimeError:  # no loop runs here: another thread
            current = None
        if current is self.task:
            return
        if current is None or CURRENT_CELL.get() is not self:
            raise ActorError(
                f"{self.path}: reply_future() was called from another task (or a "
                "callback) while a handler runs; only the handler's own task may take its "
                "reply future: take it there and hand the future over"
            )
        if HANDLER_RUN.get() != self.handler_run:
            raise ActorError(
                f"{self.path}: reply_future() was called from a task started by an "
                "earlier message's handler (or a lifecycle hook) of this actor, while the "
                "handler of a later message runs: that reply future belongs to the later "
                "message's asker; take the future in the handler that starts the task and "
                "hand it over"
            )

    def _end_handler(self) -> asyncio.Future[Any] | None:
        """The handler has returned or raised: the reply future it took, if any."""
        taken = self.reply if self.reply_taken else None
        self.reply = _OUTSIDE
        self.reply_taken = False
        return taken  # type: ignore[return-value]

    def _returned_too(self, result: Any, message: Any) -> TypeError:
        if type(result) is CoroutineType:
            result.close()  # never to be awaited: no "never awaited" warning either
        return TypeError(
            f"{self.path}: the handler of {type(message).__name__} took its reply future "
            f"and also returned {type(result).__name__}; a handler that settles its reply "
            "future itself returns None"
        )

    def _unawaited(self, coroutine: Any, method: Callable[[Any], Any], message: Any) -> ActorFailed:
        """A handler returned a coroutine, an async call it forgot to await: a bug of
        the handler, never a reply. The coroutine is closed unrun, so Python reports no
        "never awaited" warning at some later collection, far from the cause."""
        failure = ActorFailed(
            f"{self.path}: the handler {method.__qualname__} returned a coroutine "
            f"({coroutine.__qualname__}) instead of a reply to {type(message).__name__}: "
            "await it (in an async def handler) or return a value; it was closed unrun"
        )
        try:
            coroutine.close()
        except Exception as exc:  # only a coroutine started by hand runs code on close
            failure.__cause__ = exc
        return failure

    def _tell_reply_done(self, future: asyncio.Future[Any]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.log.warning("the reply future of a tell failed", exc_info=future.exception())

    async def _handler_failed(
        self, raised: BaseException, message: Any, reply: asyncio.Future[Any] | None
    ) -> bool:
        failure = self._as_failure(raised, f"handler of {type(message).__name__}")
        if reply is not None and not reply.done():
            reply.set_exception(failure)
        return await self._on_failure(failure, message)

    def _fail_ask(
        self, error: GpuActorsError, reply: asyncio.Future[Any] | None, message: Any
    ) -> None:
        """A handler raised ``error`` for its asker: the asker gets it; for a tell, or
        an ask whose reply is settled already (by the handler before it raised, or by
        an asker that gave up), nobody can, so it is logged."""
        if reply is None or reply.done():
            self.log.warning(
                "a handler raised an error meant for its asker, who cannot get it "
                "(a tell, or a reply settled already)",
                message_type=type(message).__name__,
                exc_info=error,
            )
        else:
            reply.set_exception(error)

    def _ends_the_task(self, exc: BaseException) -> bool:
        """Is ``exc``, raised in the actor's task, the end of that task rather than a
        failure: its cancellation (kill, loop shutdown; a handler may also raise
        CancelledError itself), or its coroutine being closed (a GeneratorExit thrown in
        from outside the task, by the garbage collector, not raised by a handler)?"""
        if isinstance(exc, asyncio.CancelledError):
            return self._killed or _task_is_cancelled()
        if isinstance(exc, GeneratorExit):
            try:
                return asyncio.current_task() is not self.task
            except RuntimeError:  # no loop runs: the coroutine is being closed
                return True
        return False

    def _as_failure(self, raised: BaseException, what: str) -> Exception:
        """``raised`` as the actor's failure: an Exception as it is; any other
        BaseException wrapped in ActorFailed. KeyboardInterrupt and SystemExit are also
        kept, to stop the actor and then be re-raised (the module's docstring)."""
        if isinstance(raised, Exception):
            return raised
        self._keep_exit(raised)
        how = (
            "was cancelled"
            if isinstance(raised, asyncio.CancelledError)
            else f"raised {type(raised).__name__}"
        )
        failure = ActorFailed(f"{self.path}: {what} {how}")
        failure.__cause__ = raised
        return failure

    def _keep_exit(self, raised: BaseException) -> None:
        """Keep a KeyboardInterrupt or SystemExit (the first) to re-raise once stopped."""
        if isinstance(raised, (KeyboardInterrupt, SystemExit)) and self._exit is None:
            self._exit = raised

    def _unhandled(self, message: Any, reply: asyncio.Future[Any] | None) -> None:
        handled = ", ".join(handled_types(self.instance)) or "nothing"
        if reply is not None and not reply.done():
            reply.set_exception(
                UnhandledMessage(
                    f"{type(self.instance).__name__} at {self.path} has no handler for "
                    f"{type(message).__name__} (it handles: {handled})"
                )
            )
        self.log.warning("unhandled message", message_type=type(message).__name__)
        if self._keeping_exit(partial(self.dead_letter, message, "unhandled")):
            self.request_stop()

    def defer_reply(self, future: asyncio.Future[Any], reply: asyncio.Future[Any] | None) -> None:
        """Settle ``reply`` with ``future``'s outcome once it has one (a Deferred reply)."""
        if future.done():
            _forward(future, reply, self)
            return
        link = _DeferredLink(self, future, reply)
        self.links.add(link)
        future.add_done_callback(link.on_result)
        if reply is not None:
            reply.add_done_callback(link.on_reply_done)

    async def _on_signal(self, signal: object) -> bool:
        """Handle a runtime signal; True when the actor must stop."""
        if signal is _STOP:
            return True
        if isinstance(signal, _HandledAtOnceFailed):
            _MESSAGE_TYPE.set(type(signal.message).__name__)
            _CORRELATION_ID.set(signal.cid)
            return await self._on_failure(signal.error, signal.message)
        if isinstance(signal, _ChildFailed):
            child = signal.child
            if self.children.get(child.name) is child and not child.stopping:
                return await self._on_failure(signal.error, None, failed_child=child)
        return False

    # ------------------------------------------------------------- supervision
    def _strategy(self) -> SupervisorStrategy | ActorFailed:
        """The supervisor's strategy, or, if the parent's ``supervisor_strategy`` (a
        property may compute it) raised or is no strategy, the ActorFailed that says so
        (escalated as a failed decider's is, not left to crash the actor's task)."""
        if self.props.supervisor is not None:
            return self.props.supervisor
        if self.parent is None:
            return self.system.guardian_strategy
        try:
            strategy = self.parent.instance.supervisor_strategy
        except BaseException as err:  # a synchronous call: nothing cancels it from outside
            self._keep_exit(err)
            failure = ActorFailed(
                f"{self.path}: its parent's supervisor_strategy raised {type(err).__name__}"
            )
            failure.__cause__ = err
            return failure
        if isinstance(strategy, SupervisorStrategy):
            return strategy
        return ActorFailed(
            f"{self.path}: its parent's supervisor_strategy is {strategy!r}, "
            "not a SupervisorStrategy"
        )

    async def _on_failure(
        self, exc: BaseException, message: Any, failed_child: ActorCell | None = None
    ) -> bool:
        """Apply the supervisor's directive for ``exc``; True when the actor must stop."""
        if self._exit is not None:  # the process is asked to end: stop, ask nobody
            self.cause = exc
            self.log.error("actor code asked the process to end; stopping", exc_info=exc)
            return True
        strategy = self._strategy()
        directive = (
            self._decide(strategy, exc) if isinstance(strategy, SupervisorStrategy) else strategy
        )
        if not isinstance(directive, Directive):  # the supervisor failed: escalate that
            exc = directive
            if self._exit is not None:
                self.cause = exc
                return True
            directive = Directive.ESCALATE
        self.log.warning("actor failed", directive=directive.value, exc_info=exc)
        if directive is Directive.ESCALATE:
            directive = await self._escalate(exc)
        if directive is Directive.RESUME:
            if failed_child is not None:
                failed_child.resume()
            return False
        if directive is Directive.RESTART:
            if self.stopping:  # asked to stop already: a fresh instance would only be stopped
                self.cause = exc
                return True
            assert isinstance(strategy, SupervisorStrategy)  # only its decider says RESTART
            if self.restarts.try_spend(strategy, self.loop.time()):
                return not await self._restart(exc, message)
            self.cause = ActorFailed(
                f"{self.path}: restart budget exhausted ({strategy.max_restarts} restarts "
                f"within {strategy.within}s)"
            )
            self.cause.__cause__ = exc
            self.log.error("restart budget exhausted; stopping", exc_info=exc)
            return True
        self.cause = exc
        return True

    def _decide(self, strategy: SupervisorStrategy, exc: BaseException) -> Directive | Exception:
        """The decider's directive for ``exc``, or, if it raised or returned anything
        else, the ActorFailed that says so (to be escalated)."""
        try:
            directive = strategy.decider(exc)
        except BaseException as err:  # a synchronous call: nothing cancels it from outside
            self._keep_exit(err)
            failure = ActorFailed(
                f"{self.path}: the supervisor's decider raised {type(err).__name__} on "
                f"{type(exc).__name__}"
            )
            failure.__cause__ = err
            return failure
        if isinstance(directive, Directive):
            return directive
        failure = ActorFailed(
            f"{self.path}: the supervisor's decider returned {directive!r} for "
            f"{type(exc).__name__}, not a Directive"
        )
        failure.__cause__ = exc
        return failure

    async def _escalate(self, exc: BaseException) -> Directive:
        """Fail the parent with ``exc`` and wait for its fate; at the top, stop."""
        parent = self.parent
        if parent is None or parent.stopping:
            self.log.error("failure escalated to the guardian; stopping", exc_info=exc)
            return Directive.STOP
        if self.stopping:  # asked to stop already: a parent ignores a stopping child's failure
            self.log.error("failure while stopping; stopping", exc_info=exc)
            return Directive.STOP
        self._suspension = self.loop.create_future()
        parent.mailbox.signal(_ChildFailed(self, exc))
        try:
            return await self._suspension
        finally:
            self._suspension = None

    async def _restart(self, exc: BaseException, message: Any) -> bool:
        """Replace the instance (mailbox kept); False if the new one failed to start."""
        self.log.info("restarting", error=repr(exc))
        await self._stop_children(  # children first, as when stopping
            late="children did not stop before the restart; restarting anyway"
        )
        if self._exit is not None:  # the process is asked to end: stop (post_stop runs)
            return False
        self._started = False
        try:
            await _settle_hook(self.instance.pre_restart(exc, message))
        except BaseException as err:
            if self._ends_the_task(err):
                raise
            self.log.error("pre_restart raised", exc_info=err)
            failure = self._as_failure(err, "pre_restart")
            if self._exit is not None:
                self.cause = failure
                return False
        await _settled_replies_delivered()
        self._fail_owed_replies("restarted")
        try:
            self.instance = self._new_instance()
            self.handlers = bind_handlers(self.instance)
            await _settle_hook(self.instance.post_restart(exc))
        except BaseException as err:
            if self._ends_the_task(err):
                raise
            self.cause = self._as_failure(err, "restart")
            self.log.error("restart failed; stopping", exc_info=err)
            return False
        self._started = True
        return True

    def _end_unstarted(self) -> None:
        """End this cell and its subtree, none of whose tasks has run yet: the actor's
        constructor raised, after it spawned children (already started, and under no
        registered parent, so no stop or shutdown would ever reach them) or handed out
        its ref (whose askers would wait on a mailbox nobody reads)."""
        children = reversed(tuple(self.children.values()))
        # A task cancelled before its first step runs no hook.
        run_each([*(child._end_unstarted for child in children), self.kill, self._finalize])

    def _new_instance(self) -> Actor:
        token = CONSTRUCTING.set(self.context)
        try:
            return self.props.create()
        finally:
            CONSTRUCTING.reset(token)

    # ---------------------------------------------------------------- stopping
    async def _wind_down(self) -> None:
        self.stopping = True
        self._keeping_exit(self._close_mailbox)
        await self._stop_children(late="children did not stop in time; stopping anyway")
        if self._started:
            self._started = False
            try:
                await _settle_hook(self.instance.post_stop())
            except BaseException as exc:
                if self._ends_the_task(exc):
                    raise
                self._keep_exit(exc)
                self.log.error("post_stop raised", exc_info=exc)
            await _settled_replies_delivered()

    async def _stop_children(self, *, late: str) -> None:
        """Stop the children, youngest first, within the system's shutdown timeout: past
        it the stragglers are cancelled (each logged by the system), ``late`` is logged and
        this actor's stop or restart goes on, where a child whose stop hangs would hold it
        up for good. Under a stop bounded from above (``_under_bounded_stop``) they
        wait as long as it takes: that stop's timeout (a caller's, shorter or longer)
        bounds the whole subtree at once, and its kill cancels it all."""
        if not self.children:
            return
        children = list(self.children.values())
        if self._under_bounded_stop():
            await stop_in_order(children)
            return
        try:
            await self.system._stop_within(children, None)
        except ShutdownTimeout as exc:
            self.log.error(late, error=str(exc))
        except (KeyboardInterrupt, SystemExit) as exit_request:
            # A dead-letter subscriber's, while a straggler's mailbox was refused: held
            # until this actor has stopped, like one raised in its own cleanup.
            self._keep_exit(exit_request)

    def _under_bounded_stop(self) -> bool:
        """Does a stop bounded by a timeout (``bounding_stops``) cover this cell?"""
        cell: ActorCell | None = self
        while cell is not None:
            if cell.stop_bounds:
                return True
            cell = cell.parent
        return False

    def _fail_owed_replies(self, ended: str) -> None:
        """The replies the instance owes that its last hook (``post_stop``, or
        ``pre_restart`` before a restart) left pending fail with ActorStopped: nothing
        that instance started will settle them, and its asker must not wait forever."""
        for link in tuple(self.links):
            if link.future.done():  # settled by the hook: its callback has not run yet
                link.on_result(link.future)
            elif link.reply is not None and not link.reply.done():
                link.reply.set_exception(
                    ActorStopped(f"{self.path} {ended} before its deferred reply")
                )
        self.links.clear()
        self.owed_replies.fail_pending(
            lambda: ActorStopped(f"{self.path} {ended} before settling a reply future")
        )

    def _close_mailbox(self) -> None:
        """Refuse what is still queued; every message is refused before a dead-letter
        subscriber's KeyboardInterrupt or SystemExit is raised (``run_each``)."""
        run_each(
            partial(self._refuse, message, reply) for message, reply, _ in self.mailbox.close()
        )

    def _refuse(self, message: Any, reply: asyncio.Future[Any] | None) -> None:
        if reply is not None:
            if reply.done():
                return
            reply.set_exception(self._stopped_error(message))
        self.dead_letter(message, "stopped")

    def _keeping_exit(self, publishing: Callable[[], None]) -> bool:
        """Run ``publishing`` (it publishes dead letters) in the actor's task; a
        subscriber's KeyboardInterrupt or SystemExit is kept, to be re-raised once the
        actor has stopped, rather than cut its stop sequence short. True if one was."""
        try:
            publishing()
        except (KeyboardInterrupt, SystemExit) as exit_request:
            self._keep_exit(exit_request)
            return True
        return False

    def _stopped_error(self, message: Any) -> ActorStopped:
        return ActorStopped(f"{self.path} has stopped; {type(message).__name__} was not handled")

    def _finalize(self) -> None:
        """Bookkeeping that must happen however the task ended (idempotent, never waits).

        A dead-letter subscriber's KeyboardInterrupt or SystemExit is raised once it is
        all done (by the actor's task, if it runs this, as the task's own end)."""
        if self.terminated.done():
            return
        self.stopping = True
        reply = self.reply
        if isinstance(reply, asyncio.Future) and not reply.done():  # killed inside a handler
            reply.set_exception(ActorStopped(f"{self.path} stopped before its handler finished"))
        run_each((self._close_mailbox, self._announce_stopped))

    def _announce_stopped(self) -> None:
        """``_finalize`` once the mailbox is closed: let go of the children, the owed
        replies and the watches, leave the tree, and tell the watchers."""
        for child in tuple(self.children.values()):  # (ended without winding down)
            child.request_stop()
        self._fail_owed_replies("stopped")
        for target in self.watching:
            target.watchers.discard(self)
        self.watching.clear()
        self.system._unregister(self)
        if self.parent is not None and self.parent.children.get(self.name) is self:
            del self.parent.children[self.name]
        self.terminated.set_result(None)
        notice = self._notice()
        for watcher in self.watchers:
            watcher.watching.discard(self)
            watcher.mailbox.force((notice, None, None))
        self.watchers.clear()
        for waiter in self.waiters:
            if not waiter.done():
                waiter.set_result(notice)
        self.waiters.clear()
        self.log.debug("actor stopped", cause=repr(self.cause) if self.cause else None)

    def _notice(self) -> Terminated:
        return Terminated(ref=self.ref, path=self.path, cause=self.cause)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.log.error("actor task crashed", exc_info=task.exception())
        self._finalize()

    def _uncancel(self) -> None:
        task = asyncio.current_task()
        uncancel = getattr(task, "uncancel", None)  # Python >= 3.11
        if uncancel is not None:
            uncancel()
