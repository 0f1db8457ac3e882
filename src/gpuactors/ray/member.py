"""RayMember: one Ray actor hosting an engine, as a member of a group (a RayEnginePool).

Calls follow Ray's fault model. When an actor (or its node) is lost, every call it
held fails with :class:`~gpuactors.errors.EngineLost` (it may or may not have run):
at most once, unless the call's op was declared idempotent, in which case Ray sends
it again to the restarted actor (``max_task_retries``). Ray restarts the actor
(``max_restarts``); before serving, the new instance is given every op change its
caller made, in order. Nothing accepted is dropped without an answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import ray
from ray.exceptions import ActorDiedError, RayActorError, RayError, RayTaskError

from gpuactors.engine import EnqueueBatch, ShutdownReport
from gpuactors.errors import AskTimeout, EngineError, EngineLost, EngineStopped
from gpuactors.group.members import remote_view
from gpuactors.messages import Message
from gpuactors.ray.host import CHANGES, Outcome, uncarry
from gpuactors.worker import Download, Downloaded, Free, Job, JobResult, RemoteArray, Upload

#: Calls to one actor out at once. More wait, and go together in the next call when one
#: is answered: each Ray call costs the caller's process about as much CPU as a local
#: engine takes to run a batch of 100,000 tiny tasks, so concurrent batches share it.
CALLS_IN_FLIGHT = 2

#: Ray's "retry forever": the actor's restart budget (max_restarts) still bounds it, as a
#: call to an actor that Ray will not restart fails at once. A retry can come while the
#: actor is still restarting and fail again, so a count of retries would run out early.
_UNTIL_DEAD = -1


class RayMember:
    """A Ray actor running :class:`~gpuactors.ray.host.EngineHost`, as an EngineMember."""

    isolated = True  # its arrays live in another process: RemoteArrays

    def __init__(self, actor: Any, key: int, *, idempotent: frozenset[str]) -> None:
        self.actor = actor  # the Ray actor handle (ray.kill(member.actor) ends it)
        self._key = key
        self._idempotent = idempotent
        self._changes: list[Message] = []  # op changes made on this actor, in order
        self._dead: str | None = None
        self._probing: asyncio.Task[None] | None = None
        self._in_flight = 0  # calls sent alone or together, not yet answered
        self._waiting: list[tuple[Message, asyncio.Future[Any]]] = []  # for the next call
        self._sending: set[asyncio.Task[None]] = set()  # (held: a loop keeps weak refs)
        self.ray_calls = 0  # Ray calls made to the actor (calls sent together: one)

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
        try:
            return await asyncio.wait_for(pending, timeout)
        except TimeoutError:
            raise AskTimeout(
                f"actor {self._key} did not answer {type(message).__name__} in {timeout:g} s"
            ) from None

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
        remote: RemoteArray = await self._call(Upload(array=host), False)
        return remote

    async def download(self, array: Any) -> np.ndarray:
        reply: Downloaded = await self._call(Download(array=array), False)
        host: np.ndarray = reply.array
        return host

    async def free(self, array: Any) -> None:
        await self._call(Free(array=array), False)

    def view(self, array: Any, offset: int, shape: tuple[int, ...]) -> Any:
        return remote_view(array, offset, shape)

    async def stop(self, *, force: bool = False) -> ShutdownReport:
        """Shut the engine down, then end the actor for good (no restart)."""
        self._dead = "stopped"
        try:
            outcome: Outcome = await self.actor.stop.remote(force)
        except RayError as exc:
            raise EngineLost(f"actor {self._key} was lost while it shut down: {exc}") from exc
        finally:
            ray.kill(self.actor, no_restart=True)
        if outcome.error is not None:
            raise uncarry(outcome.error)
        report: ShutdownReport = outcome.value
        return report

    async def _call(self, message: Message, idempotent: bool) -> Any:
        """Send ``message``: at once while fewer than ``CALLS_IN_FLIGHT`` calls are out,
        else with every other call waiting for the next one (op changes, and calls of
        idempotent ops, which Ray may send again, always go alone)."""
        if self._dead is not None:
            raise EngineStopped(f"actor {self._key} serves no more: {self._dead}")
        if not idempotent and not isinstance(message, CHANGES):
            if self._in_flight >= CALLS_IN_FLIGHT or self._waiting:
                answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
                self._waiting.append((message, answer))
                return await answer
            self._in_flight += 1
            try:
                (outcome,) = await self._send([message], idempotent=False)
            finally:
                self._in_flight -= 1
                self._send_waiting()
        else:
            (outcome,) = await self._send([message], idempotent)
        return self._settled(message, outcome)

    def _send_waiting(self) -> None:
        """Send every call still waiting (its caller not gone) as one Ray call."""
        waiting = [(message, answer) for message, answer in self._waiting if not answer.done()]
        self._waiting.clear()
        if waiting and self._in_flight < CALLS_IN_FLIGHT:
            self._in_flight += 1
            sending = asyncio.get_running_loop().create_task(self._deliver(waiting))
            self._sending.add(sending)
            sending.add_done_callback(self._sending.discard)
        else:
            self._waiting.extend(waiting)

    async def _deliver(self, calls: list[tuple[Message, asyncio.Future[Any]]]) -> None:
        """Send ``calls`` together and settle each caller's answer."""
        try:
            outcomes = await self._send([message for message, _ in calls], idempotent=False)
        except Exception as error:  # lost, failed by Ray, not sent: every call of them
            for _, answer in calls:
                if not answer.done():
                    answer.set_exception(error)
        else:
            for (message, answer), outcome in zip(calls, outcomes, strict=True):
                if answer.done():
                    continue
                try:
                    answer.set_result(self._settled(message, outcome))
                except Exception as error:  # (its own error: uncarry's, as data)
                    answer.set_exception(error)
        finally:
            self._in_flight -= 1
            self._send_waiting()

    async def _send(self, messages: list[Message], idempotent: bool) -> list[Outcome]:
        """Each message's outcome, from one Ray call (``call``, or ``call_many`` for
        several); op changes are replayed first to an actor that Ray restarted."""
        outcomes: list[Outcome | None] = [None] * len(messages)
        pending = list(range(len(messages)))
        while True:
            changes = len(self._changes)
            self.ray_calls += 1
            try:
                if len(pending) == 1:
                    method = self.actor.call
                    if idempotent:  # sent again until it runs, or the actor is dead for good
                        method = method.options(max_task_retries=_UNTIL_DEAD)
                    got = [await method.remote(messages[pending[0]], changes)]
                else:
                    together = [messages[index] for index in pending]
                    got = await self.actor.call_many.remote(together, changes)
            except RayTaskError as exc:  # the actor ran the call and failed: not a loss
                raise EngineError(f"actor {self._key} failed {_what(messages)}: {exc}") from exc
            except RayError as exc:
                self._lost(exc)
                retried = " (Ray sent it again, as its op is idempotent)" if idempotent else ""
                raise EngineLost(
                    f"actor {self._key} was lost with {_what(messages)} in flight{retried}; "
                    f"it may or may not have run: {type(exc).__name__}: {exc}"
                ) from exc
            behind = [
                (index, outcome.replay_from)
                for index, outcome in zip(pending, got, strict=True)
                if outcome.replay_from is not None
            ]
            for index, outcome in zip(pending, got, strict=True):
                if outcome.replay_from is None:
                    outcomes[index] = outcome
            if not behind:
                return [outcome for outcome in outcomes if outcome is not None]
            await self._replay(min(first for _, first in behind))
            pending = [index for index, _ in behind]

    def _settled(self, message: Message, outcome: Outcome) -> Any:
        """``message``'s value, or its error raised; an op change is counted."""
        if outcome.error is not None:
            raise uncarry(outcome.error)
        if isinstance(message, CHANGES):
            self._changes.append(message)
        return outcome.value

    async def _replay(self, first: int) -> None:
        try:
            outcome: Outcome = await self.actor.replay.remote(self._changes[first:], first)
        except RayError as exc:
            self._lost(exc)
            raise EngineLost(f"actor {self._key} was lost while it caught up: {exc}") from exc
        if outcome.error is not None:
            raise uncarry(outcome.error)

    def _lost(self, error: RayError) -> None:
        """After a loss, find out in the background whether Ray restarts the actor: a call
        to an actor that will never come back fails at once with ActorDiedError."""
        if not isinstance(error, RayActorError) or self._probing is not None:
            return

        async def probe() -> None:
            try:
                await self.actor.ping.remote()
            except ActorDiedError as exc:
                self._dead = f"the actor died and Ray will not restart it: {exc}"
            except RayError:
                pass  # unavailable for now (restarting): a later call finds out
            finally:
                self._probing = None

        self._probing = asyncio.get_running_loop().create_task(probe())


def _what(messages: list[Message]) -> str:
    if len(messages) == 1:
        return f"this {type(messages[0]).__name__}"
    return f"{len(messages)} calls sent together"


def _op_of(message: Message) -> str | None:
    return message.op if isinstance(message, Job | EnqueueBatch) else None
