"""RayMember: one Ray actor hosting an engine, as a member of a group (a RayEnginePool).

Calls follow Ray's fault model. When an actor (or its node) is lost, every call it
held fails with :class:`~gpuactors.errors.EngineLost` (it may or may not have run):
at most once, unless the call's op was declared idempotent, in which case Ray sends
it again to the restarted actor (``max_task_retries``). Ray restarts the actor
(``max_restarts``); before serving, the new instance is given every op change its
caller made, in order. One that it refuses ends the member (see ``_replay``). Nothing
accepted is dropped without an answer.

Batches go over the actor's link (:mod:`gpuactors.worker.link`), a connection of their
own, unless their op is idempotent (Ray's retries need a Ray call) or the pool was
started with ``link=False``; losing the link is losing the actor for the batches it
carried (EngineLost), and the next batch opens a new link through Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Sequence
from typing import Any

import numpy as np
import ray
from ray.exceptions import (
    ActorDiedError,
    ActorUnavailableError,
    RayActorError,
    RayError,
    RayTaskError,
)

from gpuactors.actors.deadlines import answered_within
from gpuactors.engine import Drain, EnqueueBatch, ShutdownReport
from gpuactors.errors import (
    DeviceFailed,
    DeviceFault,
    EngineError,
    EngineLost,
    EngineStopped,
    GpuActorsError,
    WorkerError,
)
from gpuactors.group.members import remote_view
from gpuactors.logs import get_logger
from gpuactors.messages import Message
from gpuactors.ray.host import CHANGES, Outcome, uncarry
from gpuactors.worker import Download, Downloaded, Free, Job, JobResult, RemoteArray, Upload
from gpuactors.worker.link import Link, LinkAddress, NoLink, OpenLink
from gpuactors.worker.wire import sendable_batch

#: Ray's "retry forever": the actor's restart budget (max_restarts) still bounds it, as a
#: call to an actor that Ray will not restart fails at once. A retry can come while the
#: actor is still restarting and fail again, so a count of retries would run out early.
_UNTIL_DEAD = -1
#: How long a member tries to connect to an actor's link before it sends through Ray
#: (and, after a stop, waits for the answers still on their way over it).
LINK_CONNECT_SECONDS = 10.0
_STOPPED = "stopped"
#: A replay's errors that are no refusal of a change: the actor (or its engine's worker)
#: starts anew and the next call replays again; DeviceFailed ends the member as it does
#: any call's, and EngineStopped answers a stop.
_NOT_REFUSED = (DeviceFault, DeviceFailed, WorkerError, EngineStopped)

log = get_logger(component="ray")


class RayMember:
    """A Ray actor running :class:`~gpuactors.ray.host.EngineHost`, as an EngineMember."""

    isolated = True  # its arrays live in another process: RemoteArrays

    def __init__(
        self, actor: Any, key: int, *, idempotent: frozenset[str], link: bool = True
    ) -> None:
        self.actor = actor  # the Ray actor handle (ray.kill(member.actor) ends it)
        self._key = key
        self._idempotent = idempotent
        self._changes: list[Message] = []  # op changes made on this actor, in order
        self._dead: str | None = None
        self._probing: asyncio.Task[None] | None = None
        self._use_link = link  # batches over the link, until it cannot be had
        self._link: Link | None = None
        self._opening = asyncio.Lock()
        self._watching: asyncio.Task[None] | None = None  # hears from Ray of a loss
        self._watched: Link | None = None  # the link that watch breaks
        self.ray_calls = 0  # calls made through Ray (batches over the link are not)
        self._freeing: set[asyncio.Task[None]] = set()  # uploads whose caller left

    @property
    def key(self) -> int:
        return self._key

    @property
    def serving(self) -> bool:
        return self._dead is None

    async def ping(self) -> None:
        """A bare Ray actor call, for the per-call cost of Ray itself."""
        await self.actor.ping.remote()

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        pending = self._call(message, _op_of(message) in self._idempotent)
        if timeout is None:
            return await pending
        unanswered = f"actor {self._key} did not answer {type(message).__name__}"
        return await answered_within(pending, timeout, unanswered)

    async def run(
        self,
        op: str,
        args: Sequence[Any],
        *,
        n: int,
        blocks: int = 1,
        timeout: float | None = None,
        returns: tuple[int, ...] | None = None,
    ) -> JobResult:
        job = Job(op=op, args=tuple(args), n=n, blocks=blocks, timeout=timeout, returns=returns)
        result: JobResult = await self._call(job, op in self._idempotent)
        return result

    async def upload(self, host: np.ndarray) -> RemoteArray:
        """``host`` copied into the actor's engine. A caller that stops waiting does not
        stop the call: the array it makes is freed when it lands, as no one else could
        ever name it."""
        pending = asyncio.ensure_future(self._call(Upload(array=host), False))
        try:
            remote: RemoteArray = await asyncio.shield(pending)
        except asyncio.CancelledError:
            pending.add_done_callback(self._free_unclaimed)
            raise
        return remote

    def _free_unclaimed(self, pending: asyncio.Future[RemoteArray]) -> None:
        if pending.cancelled() or pending.exception() is not None:
            return  # (nothing was made, or the actor that held it was lost)
        freeing = asyncio.get_running_loop().create_task(self._free_quietly(pending.result()))
        self._freeing.add(freeing)  # (the loop keeps only a weak reference)
        freeing.add_done_callback(self._freeing.discard)

    async def _free_quietly(self, array: RemoteArray) -> None:
        try:
            await self.free(array)
        except GpuActorsError as exc:  # (a stopped or lost actor freed it with itself)
            log.debug("an unclaimed upload was not freed", actor=self._key, error=str(exc))

    async def download(self, array: Any) -> np.ndarray:
        reply: Downloaded = await self._call(Download(array=array), False)
        host: np.ndarray = reply.array
        return host

    async def free(self, array: Any) -> None:
        await self._call(Free(array=array), False)

    def view(self, array: Any, offset: int, shape: tuple[int, ...]) -> Any:
        return remote_view(array, offset, shape)

    async def stop(self, *, force: bool = False) -> ShutdownReport:
        """Shut the engine down, then end the actor for good (no restart). The batches
        already sent on the link reach the engine before the stop (which goes through
        Ray): unless ``force``, the stop waits for their answers first. Answers the
        actor wrote before the stop's reply are read before the link closes."""
        if self._dead == _STOPPED:
            raise EngineStopped(f"actor {self._key} was stopped already")
        self._dead = _STOPPED
        link = self._link
        try:
            if link is not None and not force:
                await link.settled()
            outcome: Outcome = await self.actor.stop.remote(force)
        except RayError as exc:
            raise EngineLost(f"actor {self._key} was lost while it shut down: {exc}") from exc
        finally:
            if link is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(link.settled(), LINK_CONNECT_SECONDS)
                link.close("the actor was stopped")
            ray.kill(self.actor, no_restart=True)
        if outcome.error is not None:
            raise uncarry(outcome.error)
        report: ShutdownReport = outcome.value
        return report

    async def _call(self, message: Message, idempotent: bool) -> Any:
        """Send ``message``; replay op changes first to an actor that Ray restarted."""
        try:
            return await self._sent(message, idempotent)
        except DeviceFailed as exc:
            # The actor's isolated engine spent its restart budget: the actor lives on but
            # its engine serves no more, so it leaves the pool's service (as an isolated
            # member of a group does), or placement would go on choosing it.
            self._end(f"its engine failed for good: {exc}")
            raise

    async def _sent(self, message: Message, idempotent: bool) -> Any:
        if self._dead is not None:
            raise EngineStopped(f"actor {self._key} serves no more: {self._dead}")
        if isinstance(message, EnqueueBatch):  # evenly spaced offsets cross as 3 integers
            message = sendable_batch(message)
        if isinstance(message, Drain) and self._link is not None:
            await self._link.settled()  # the batches sent before it, on their way
        if self._use_link and isinstance(message, EnqueueBatch) and not idempotent:
            link = self._link
            if link is None or link.broken:  # (a working one is used without the lock)
                link = await self._linked()
            if link is not None:
                return await link.ask(message)
        method = self.actor.call
        if idempotent:  # sent again until it runs, or the actor is dead for good
            method = method.options(max_task_retries=_UNTIL_DEAD)
        while True:
            changes = len(self._changes)
            self.ray_calls += 1
            link_then = self._link
            try:
                outcome: Outcome = await self._noted(method.remote(message, changes), message)
            except RayTaskError as exc:  # the actor ran the call and failed: not a loss
                what = type(message).__name__
                raise EngineError(f"actor {self._key} failed {what}: {exc}") from exc
            except RayError as exc:
                self._lost(exc, link_then)
                raise self._unanswered(message, exc, idempotent) from exc
            if outcome.replay_from is None:
                break
            await self._replay(outcome.replay_from, idempotent)
        if outcome.error is not None:
            raise uncarry(outcome.error)
        return outcome.value

    def _unanswered(self, message: Message, error: RayError, idempotent: bool) -> EngineLost:
        """EngineLost for a call that Ray ended with no answer: it may or may not have run
        (the word a group reads as "it may hold the change", whether or not the actor was
        lost; an error the actor answered means it changed nothing)."""
        what = type(message).__name__
        cause = f"{type(error).__name__}: {error}"
        if _may_hold(error):
            return EngineLost(
                f"Ray failed actor {self._key}'s {what} call without reporting the actor "
                f"lost; it may or may not have run: {cause}"
            )
        retried = " (Ray sent it again, as its op is idempotent)" if idempotent else ""
        return EngineLost(
            f"actor {self._key} was lost with this {what} in flight{retried}; it may or may "
            f"not have run: {cause}"
        )

    def _noted(self, reply: Awaitable[Outcome], message: Message) -> Awaitable[Outcome]:
        """``reply``; for an op change, noted in the change log as soon as the actor says
        it applied it, whether or not its caller still waits: a timeout or a cancel ends
        the wait, not the call, and an instance that Ray restarts must be given every
        change the lost one had applied (a change missing from the log would be missing
        from it, and the actors of the pool would disagree)."""
        if not isinstance(message, CHANGES):
            return reply
        pending = asyncio.ensure_future(reply)
        pending.add_done_callback(functools.partial(self._note_change, message))
        return asyncio.shield(pending)

    def _note_change(self, message: Message, pending: asyncio.Future[Outcome]) -> None:
        """A change whose call Ray failed while its actor may hold it is noted too (and
        logged): noted, it is given to the actor at its next call if it lacks it (the
        actor answers ``replay_from``), so the log stays what the actor holds; unnoted, an
        instance holding it would be restarted without it."""
        if pending.cancelled():
            return
        error = pending.exception()
        if error is None:
            outcome = pending.result()
            if outcome.replay_from is None and outcome.error is None:
                self._changes.append(message)
        elif _may_hold(error):
            self._changes.append(message)
            log.warning(
                "Ray failed an op change's call but not its actor; the change is kept, and "
                "given to the actor again if it lacks it",
                actor=self._key, change=len(self._changes) - 1, message=type(message).__name__,
                error=f"{type(error).__name__}: {error}",
            )  # fmt: skip
        # (else a loss: the instance that may hold it is gone; or the actor refused it)

    async def _linked(self) -> Link | None:
        """The actor's link, opened through Ray if there is none that works; None (batches
        go through Ray from then on, with a warning) if it cannot be had."""
        async with self._opening:
            link = self._link
            if link is not None and not link.broken:
                return link
            if self._dead is not None:
                raise EngineStopped(f"actor {self._key} serves no more: {self._dead}")
            if not self._use_link:  # (given up while this batch waited: no second try)
                return None
            why = ""
            for _ in range(2):  # (the actor may have been lost between answer and connect)
                address: LinkAddress | NoLink = await self._call(OpenLink(), False)
                if isinstance(address, NoLink):
                    why = address.reason
                    break
                try:
                    link = await asyncio.wait_for(
                        Link.connect(address, f"actor {self._key}"), LINK_CONNECT_SECONDS
                    )
                except (OSError, asyncio.TimeoutError) as exc:
                    why = f"{address.host}:{address.port} cannot be reached: {exc!r}"
                    continue
                self._link = link
                self._watch()
                return link
            self._use_link = False
            log.warning(
                "a Ray actor's link cannot be had; its batches go through Ray calls",
                actor=self._key, reason=why,
            )  # fmt: skip
            return None

    def _watch(self) -> None:
        """Keep a call out to the actor (``EngineHost.watch``) that Ray fails when the
        actor is lost: then the link breaks at once rather than at TCP's timeout. One
        watch per link: the watch of a link that was replaced is given up."""
        link = self._link
        if self._watching is not None and not self._watching.done():
            if self._watched is link:
                return
            self._watching.cancel()
        self._watched = link

        async def watch() -> None:
            try:
                await self.actor.watch.remote()
            except RayError as exc:
                self._lost(exc, link)  # (which breaks the link)

        self._watching = asyncio.get_running_loop().create_task(watch())

    async def _replay(self, first: int, idempotent: bool) -> None:
        """Give an actor that Ray restarted the op changes from ``first`` on. A change it
        refuses (its new node cannot compile or load the op, say) it would refuse at every
        call, each call replaying and failing while the member looked as if it served: the
        member ends instead (logged), and its callers get EngineStopped at once. The
        errors of ``_NOT_REFUSED`` go to the caller as they are. The catch-up of an
        idempotent call is sent again after a loss as the call is (a replay skips the
        changes the actor has; one that a newer instance lacks more of makes the next
        call answer ``replay_from`` again)."""
        link_then = self._link
        method = self.actor.replay
        if idempotent:
            method = method.options(max_task_retries=_UNTIL_DEAD)
        try:
            outcome: Outcome = await method.remote(self._changes[first:], first)
        except RayTaskError as exc:  # (it could not take the changes at all)
            raise self._refused(first, exc) from exc
        except RayError as exc:
            self._lost(exc, link_then)
            raise EngineLost(f"actor {self._key} was lost while it caught up: {exc}") from exc
        if outcome.error is None:
            return
        error = uncarry(outcome.error)
        if isinstance(error, _NOT_REFUSED):
            raise error
        at = first if outcome.replay_from is None else outcome.replay_from
        raise self._refused(at, error) from error

    def _refused(self, index: int, error: Exception) -> EngineStopped:
        """End this member (logged once): its actor refused op change ``index``."""
        change = type(self._changes[index]).__name__
        why = f"its restarted instance refused op change {index} ({change}): {error!r}"
        if self._dead is None:
            log.error(
                "a restarted Ray actor refused an op change it must replay; it leaves the "
                "pool's service",
                actor=self._key, change=index, message=change, error=repr(error),
            )  # fmt: skip
        self._end(why)
        return EngineStopped(f"actor {self._key} serves no more: {why}")

    def _lost(self, error: RayError, link: Link | None) -> None:
        """After a loss, find out in the background whether Ray restarts the actor: a call
        to an actor that will never come back fails at once with ActorDiedError. ``link``,
        the one in use when the failed call was sent, is broken: its batches get
        EngineLost. (Not the link in use now: a late report of the lost instance must
        not break a link to the one Ray started since.)"""
        if not isinstance(error, RayActorError):
            return
        if link is not None:
            link.close(f"Ray reports the actor lost: {type(error).__name__}")
        if self._probing is not None:
            return

        async def probe() -> None:
            try:
                await self.actor.ping.remote()
            except ActorDiedError as exc:
                self._end(f"the actor died and Ray will not restart it: {exc}")
            except RayError:
                pass  # unavailable for now (restarting): a later call finds out
            finally:
                self._probing = None

        self._probing = asyncio.get_running_loop().create_task(probe())

    def _end(self, why: str) -> None:
        """This member serves no more, for ``why``, unless it has ended already: the
        first end stays (a stop kills the actor, and Ray's late report of that death
        must not turn the stop into a loss: a second ``stop()`` says EngineStopped)."""
        if self._dead is None:
            self._dead = why


def _may_hold(error: BaseException) -> bool:
    """Did Ray end a call with ``error`` while its actor may hold what it did? Not for a
    loss (the instance is gone) nor for RayTaskError (raised outside the engine's answer,
    which is data: nothing was applied); for any other RayError, and for an actor that
    Ray cannot reach for now (ActorUnavailableError), yes."""
    if isinstance(error, ActorUnavailableError):
        return True
    return isinstance(error, RayError) and not isinstance(error, RayActorError | RayTaskError)


def _op_of(message: Message) -> str | None:
    return message.op if isinstance(message, Job | EnqueueBatch) else None
