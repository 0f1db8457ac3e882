"""Engine: the typed client of a running PersistentEngineActor.

``enqueue`` is the hot path: it hands its task to the actor through this client's
submissions (:mod:`gpuactors.engine.submissions`); everything else is one ask.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, Literal

from gpuactors.actors import ActorRef, ActorSystem, MailboxConfig, Props
from gpuactors.engine import streams
from gpuactors.engine.actor import PersistentEngineActor
from gpuactors.engine.messages import (
    Completion,
    Drain,
    Drained,
    EngineStats,
    Park,
    Parked,
    Resume,
    Shutdown,
    ShutdownReport,
    Stats,
)
from gpuactors.engine.ops import OpSpec
from gpuactors.engine.runtime import EngineConfig
from gpuactors.engine.submissions import After, Submissions, Submit, check_task_fields
from gpuactors.errors import ActorStopped, AskTimeout, GpuActorsError, MailboxFull
from gpuactors.nvrtc import KernelCompiler

_PARK_NAMES = itertools.count(1)  # each ``parked()`` block's Park, told apart by its Resume


class Engine:
    """A typed handle on a running PersistentEngineActor."""

    def __init__(self, ref: ActorRef, device_id: int = 0) -> None:
        self.ref = ref
        self.device_id = device_id  # whose current stream orders after="current_stream"
        self._submissions = Submissions()
        self._submit = Submit(submissions=self._submissions)  # one message for every ask
        self._waiting = 0  # callers of this client waiting for their task's reply
        self._handing_over: set[asyncio.Task[None]] = set()

    @classmethod
    async def start(
        cls,
        system: ActorSystem,
        *,
        ops: Sequence[OpSpec] = (),
        config: EngineConfig | None = None,
        name: str = "engine",
        device_id: int = 0,
        full_policy: Literal["wait", "fail"] = "wait",
        compiler: KernelCompiler | None = None,
        mailbox: MailboxConfig | None = None,
    ) -> Engine:
        """Spawn the engine actor and wait until its kernel module is loaded."""
        props = Props(
            PersistentEngineActor,
            args=(tuple(ops), config),
            kwargs={"device_id": device_id, "full_policy": full_policy, "compiler": compiler},
            mailbox=mailbox or MailboxConfig(capacity=65536),
        )
        engine = cls(system.spawn(props, name=name), device_id)
        try:
            await engine.stats()
        except ActorStopped:
            cause = (await system.watch(engine.ref)).cause  # e.g. NoCudaDevice, CompileError
            if cause is not None:
                raise cause from None
            raise
        return engine

    async def enqueue(
        self,
        op: str,
        *args: Any,
        n: int,
        blocks: int = 1,
        timeout: float | None = None,
        after: After = "current_stream",
    ) -> Completion:
        """Run ``op`` on ``args`` over ``n`` elements; what ``ask(Enqueue(...))`` does,
        with the same checks and errors, without building a message per task. A lone
        caller's task is handed over in its own task (on an idle engine: answered in
        line); while this client's other callers wait, it joins the tasks that one
        ``Submit`` per loop turn hands over (see :mod:`gpuactors.engine.submissions`)."""
        n, blocks, seconds = check_task_fields(n, blocks, timeout, after)
        stream = streams.current_stream(self.device_id) if after == "current_stream" else None
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        entries = self._submissions.entries
        entries.append((future, op, args, n, blocks, seconds, stream))
        if len(entries) == 1:  # else a Submit is on its way for the list: it takes this too
            if self._waiting:
                self._hand_over_soon()
            else:
                try:
                    await self.ref.ask(self._submit)  # an idle engine: answered in line
                except BaseException as exc:
                    self._ask_failed(exc, future)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
        if future.done():
            return future.result()
        self._waiting += 1
        try:
            return await future
        finally:
            self._waiting -= 1

    async def _hand_over(self) -> None:
        """Ask the actor to accept the submitted tasks, from a task of its own."""
        try:
            await self.ref.ask(self._submit)
        except BaseException as exc:
            self._ask_failed(exc, None)
            if isinstance(exc, asyncio.CancelledError):
                raise

    def _ask_failed(self, exc: BaseException, own: asyncio.Future[Completion] | None) -> None:
        """A Submit's ask ended in ``exc`` with tasks perhaps still waiting: none is
        lost. If the actor stopped (or its handler failed), they fail with its error,
        the asker's ``own`` task too; if the asker was cancelled, its own task is
        dropped and another Submit goes for the rest."""
        entries = self._submissions.entries
        if isinstance(exc, asyncio.CancelledError):
            if own is not None:
                own.cancel()
            entries[:] = [entry for entry in entries if not entry[0].done()]
            if entries:
                self._hand_over_soon()
            return
        for future, *_ in self._submissions.take():
            if not future.done():
                future.set_exception(exc)
        if own is not None and not own.done():  # taken by the handler before it failed
            own.set_exception(exc)

    def _hand_over_soon(self) -> None:
        """Hand the submitted tasks over from a task of their own: it runs once every
        caller ready in this loop turn has submitted."""
        task = asyncio.get_running_loop().create_task(self._hand_over())
        self._handing_over.add(task)  # (the loop keeps only a weak reference)
        task.add_done_callback(self._handing_over.discard)

    async def stats(self) -> EngineStats:
        reply: EngineStats = await self.ref.ask(Stats(), timeout=120.0)
        return reply

    async def drain(self, timeout: float | None = None) -> Drained:
        reply: Drained = await self.ref.ask(Drain(), timeout=timeout)
        return reply

    async def shutdown(
        self, *, force: bool = False, timeout: float | None = None
    ) -> ShutdownReport:
        reply: ShutdownReport = await self.ref.ask(Shutdown(force=force), timeout=timeout)
        return reply

    @asynccontextmanager
    async def parked(self) -> AsyncIterator[Parked]:
        """Keep the kernel parked inside the block (e.g. to load modules, or to measure).

        Its Park is named, and its Resume names it: a caller cancelled just as the Park
        answered (the reply never reached it) still ends that Park, and only that one;
        for a Park that had not answered, that Resume does nothing (it ended itself)."""
        hold = next(_PARK_NAMES)
        try:
            parked: Parked = await self.ref.ask(Park(hold=hold), timeout=30.0)
        except (asyncio.CancelledError, AskTimeout):
            with suppress(MailboxFull):
                self.ref.tell(Resume(hold=hold))
            raise
        try:
            yield parked
        except BaseException:
            # The block's own error is the caller's to see: a Resume that fails as well
            # (the engine faulted meanwhile) must not replace it.
            with suppress(GpuActorsError):
                await self.ref.ask(Resume(hold=hold), timeout=30.0)
            raise
        await self.ref.ask(Resume(hold=hold), timeout=30.0)
