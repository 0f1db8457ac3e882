"""ActorSystem: the root of an actor tree and the owner of its shutdown."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from types import TracebackType

from gpuactors.actors.actor import Actor
from gpuactors.actors.at_once import AtOnceStreak
from gpuactors.actors.cell import (
    CURRENT_CELL,
    ActorCell,
    bounding_stops,
    run_each,
    stop_in_order,
)
from gpuactors.actors.checks import count, optional_seconds, seconds
from gpuactors.actors.dead_letters import DeadLetters
from gpuactors.actors.props import Props
from gpuactors.actors.ref import ActorRef, cell_of
from gpuactors.actors.supervision import SupervisorStrategy
from gpuactors.actors.terminated import Terminated
from gpuactors.errors import (
    ActorNameTaken,
    ActorNotFound,
    ActorStopped,
    InvalidArgument,
    ShutdownTimeout,
)
from gpuactors.logs import get_logger

#: How long cancelled actors get to finish their stop sequence after a timeout.
_KILL_GRACE = 0.5


class ActorSystem:
    """Spawns, finds and stops actors; on exit stops them all, children before parents.

    Use it as an async context manager. Top-level actors are supervised by the
    guardian with ``guardian_strategy``; a failure escalated to the guardian stops the
    actor. Stopping is bounded: actors that outlive the timeout are cancelled and
    :class:`~gpuactors.errors.ShutdownTimeout` is raised, so shutdown never hangs.
    An actor's stop or restart waits for its children within ``shutdown_timeout`` too
    (past it they are cancelled and logged, and the stop or restart goes on), unless a
    :meth:`stop` or :meth:`shutdown` already bounds it with its own timeout.
    Every argument is checked when given (InvalidArgument): ``shutdown_timeout`` is a
    finite number of seconds above 0, ``dead_letter_capacity`` a whole number >= 0.
    """

    def __init__(
        self,
        name: str = "gpuactors",
        *,
        shutdown_timeout: float = 10.0,
        guardian_strategy: SupervisorStrategy | None = None,
        dead_letter_capacity: int = 1000,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"an actor system's name is a non-empty string, not {name!r}")
        if guardian_strategy is not None and not isinstance(guardian_strategy, SupervisorStrategy):
            raise InvalidArgument(
                f"guardian_strategy must be a SupervisorStrategy or None, not {guardian_strategy!r}"
            )
        self.name = name
        self.shutdown_timeout = seconds(shutdown_timeout, "shutdown_timeout")
        self.guardian_strategy = guardian_strategy or SupervisorStrategy()
        self.dead_letters = DeadLetters(count(dead_letter_capacity, "dead_letter_capacity", 0))
        self.log = get_logger(system=name)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._top: dict[str, ActorCell] = {}
        self._cells: dict[str, ActorCell] = {}
        self._closing = False
        self._shutdown: asyncio.Future[None] | None = None
        self._shutdown_task: asyncio.Task[None] | None = None  # one an actor started
        self._serial = itertools.count(1)
        #: When this loop's current run of asks answered at once began.
        self.at_once = AtOnceStreak()

    def __repr__(self) -> str:
        return f"ActorSystem({self.name!r}, actors={len(self._cells)})"

    async def __aenter__(self) -> ActorSystem:
        self._loop = asyncio.get_running_loop()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the actors run on (the one running when first used)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    # ----------------------------------------------------------------- actors
    def spawn(self, target: type[Actor] | Props, name: str | None = None) -> ActorRef:
        """Start a top-level actor; ``name`` defaults to a unique one from the class.

        What the actor's constructor raises, spawn raises, having ended the actor and
        the children that constructor spawned (none of them ever starts)."""
        return self._spawn(target, name, parent=None)

    def lookup(self, path: str) -> ActorRef:
        """The live actor at ``path`` (``"/a/b"``; the leading slash is optional)."""
        if not isinstance(path, str):
            raise InvalidArgument(f"an actor path is a string such as '/a/b', not {path!r}")
        cell = self._cells.get("/" + path.strip("/"))
        if cell is None:
            raise ActorNotFound(f"no live actor at {path!r} in system {self.name!r}")
        return cell.ref

    def watch(self, ref: ActorRef) -> asyncio.Future[Terminated]:
        """A future that resolves with ``Terminated`` when ``ref`` stops."""
        return cell_of(ref, "watch").watch_future()

    async def stop(self, ref: ActorRef, timeout: float | None = None) -> None:
        """Stop ``ref`` (children first) and wait until it has stopped; ``ref`` must be
        one of this system's actors (InvalidArgument).

        Called from inside the actor or one of its descendants it only requests the
        stop (waiting would deadlock). Past ``timeout`` (default: the system's
        shutdown timeout) the subtree is cancelled and ``ShutdownTimeout`` raised.
        """
        cell = cell_of(ref, "stop")
        if cell.system is not self:  # its timeout could cancel none of that system's actors
            raise InvalidArgument(
                f"{cell.path} belongs to actor system {cell.system.name!r}, not {self.name!r}: "
                "stop it through its own"
            )
        timeout = optional_seconds(timeout, "stop timeout")
        current = CURRENT_CELL.get()
        if current is not None and current.is_within(cell):
            cell.request_stop()
            return
        await self._stop_within([cell], timeout)

    async def shutdown(self, timeout: float | None = None) -> None:
        """Stop every actor, youngest top-level first, each after its children.

        Called from inside an actor (its handler, or a task started from it) it starts
        the shutdown and returns at once: waiting for every actor, the caller's own
        too, would deadlock. The shutdown's outcome is then logged. ``timeout`` (default:
        the system's shutdown timeout) is as for :meth:`stop`; a call that finds a
        shutdown under way joins it within its own timeout."""
        timeout = optional_seconds(timeout, "shutdown timeout")
        if CURRENT_CELL.get() is None:
            await self._shut_down(timeout)
        elif self._shutdown is None and self._shutdown_task is None:
            task = self.loop.create_task(self._shut_down(timeout), name=f"{self.name}-shutdown")
            task.add_done_callback(self._shutdown_task_done)
            self._shutdown_task = task

    def _shutdown_task_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.log.error("actor system shutdown failed", exc_info=task.exception())

    async def _shut_down(self, timeout: float | None) -> None:
        if self._shutdown is not None:
            # One is under way (an actor asked for it): join it within this caller's own
            # timeout, which waiting for that shutdown to end would not honour.
            await self._stop_within(list(self._top.values()), timeout)
            return
        self._closing = True
        self._shutdown = self.loop.create_future()
        try:
            await self._stop_within(list(self._top.values()), timeout)
        finally:
            self._shutdown.set_result(None)
            self.log.debug("actor system stopped", dead_letters=self.dead_letters.total)

    # --------------------------------------------------------------- internals
    def _spawn(
        self, target: type[Actor] | Props, name: str | None, parent: ActorCell | None
    ) -> ActorRef:
        # A child is refused only once its parent's stop sequence has begun (its mailbox
        # closes before its children stop): an actor still starting while a stop or a
        # shutdown waits (its pre_start, a restart's post_restart) may spawn children,
        # which it stops before itself like any other.
        if parent is None and self._closing:
            raise ActorStopped(f"actor system {self.name!r} is shutting down")
        if parent is not None and parent.mailbox.closed:
            raise ActorStopped(f"{parent.path} is stopping and cannot spawn children")
        props = target if isinstance(target, Props) else Props(target)
        siblings = self._top if parent is None else parent.children
        name = self._free_name(props, name, siblings, parent)
        cell = ActorCell(self, props, name, parent)
        siblings[name] = cell
        self._cells[cell.path] = cell
        cell.start()
        return cell.ref

    def _free_name(
        self,
        props: Props,
        name: str | None,
        siblings: dict[str, ActorCell],
        parent: ActorCell | None,
    ) -> str:
        if name is None:
            base = props.actor_class.__name__.lower()
            auto = f"{base}-{next(self._serial)}"
            while auto in siblings:
                auto = f"{base}-{next(self._serial)}"
            return auto
        if not isinstance(name, str) or not name or "/" in name:
            raise InvalidArgument(f"an actor name is a non-empty string without '/', not {name!r}")
        if name in siblings:
            where = parent.path if parent is not None else ""
            raise ActorNameTaken(f"{where}/{name} already exists in system {self.name!r}")
        return name

    def _unregister(self, cell: ActorCell) -> None:
        if self._cells.get(cell.path) is cell:
            del self._cells[cell.path]
        if cell.parent is None and self._top.get(cell.name) is cell:
            del self._top[cell.name]

    async def _stop_within(self, roots: Sequence[ActorCell], timeout: float | None) -> None:
        """Stop ``roots`` youngest first; past the timeout cancel their subtrees and raise.

        Their subtrees are marked meanwhile: this timeout alone bounds every stop in them."""
        with bounding_stops(roots):
            await self._stop_or_kill(roots, timeout)

    async def _stop_or_kill(self, roots: Sequence[ActorCell], timeout: float | None) -> None:
        limit = self.shutdown_timeout if timeout is None else timeout
        stopper = self.loop.create_task(stop_in_order(roots))
        try:
            done, _ = await asyncio.wait((stopper,), timeout=limit)
        except asyncio.CancelledError:
            stopper.cancel()
            self._kill_subtrees(roots)
            raise
        if done:
            return
        stopper.cancel()
        stragglers = self._kill_subtrees(roots)
        for _ in range(2):  # cancel, and once more for a stop sequence stuck in post_stop
            tasks = {
                cell.task for cell in stragglers if cell.task is not None and not cell.task.done()
            }
            if not tasks:
                break
            await asyncio.wait(tasks, timeout=_KILL_GRACE)
            for cell in stragglers:
                cell.kill()
        paths = ", ".join(cell.path for cell in stragglers)
        self.log.error("actors cancelled after the stop timeout", timeout=limit, actors=paths)
        run_each(cell._finalize for cell in stragglers)  # even if a task ignored the cancel
        raise ShutdownTimeout(
            f"{len(stragglers)} actor(s) did not stop within {limit}s and were cancelled: {paths}"
        )

    def _kill_subtrees(self, roots: Sequence[ActorCell]) -> list[ActorCell]:
        doomed = [
            cell for cell in self._cells.values() if any(cell.is_within(root) for root in roots)
        ]
        for cell in doomed:
            cell.kill()
        return doomed
