"""Live operators: install, prepare, replace, alias and roll back ops while the
engine serves.

An install compiles a new engine module with the op added (off the mailbox: the
old module keeps serving), then hands the ring over: park at a task boundary,
load the module in a worker thread, relaunch on demand. Every accepted task stays
in the ring meanwhile. An alias switch or a rollback is a table update only.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from gpuactors.actors import Deferred, failed_reply
from gpuactors.engine.codegen import build_engine_module, cached_engine_module
from gpuactors.engine.messages import (
    AliasOp,
    OpAliasSet,
    OpInstalled,
    OpPrepared,
    PrepareOp,
    ReplaceOp,
    Rollback,
)
from gpuactors.engine.ops import OpSpec
from gpuactors.engine.optable import OpTable
from gpuactors.engine.service import Service
from gpuactors.errors import EngineError, EngineStopped, GpuActorsError
from gpuactors.gil import prompt_handover
from gpuactors.nvrtc import KernelCompiler

T = TypeVar("T")


class LiveOps:
    """One engine's op changes: the modules it built, and the install under way."""

    def __init__(
        self,
        ops: OpTable,
        service: Service,
        *,
        compiler: KernelCompiler | None,
        block_threads: int,
        wake: asyncio.Event,
        hold_changed: Callable[[], None],
        errands: Errands,
        log: Any,
    ) -> None:
        """``hold_changed``: the actor recomputes the kernel's hold (``swapping`` is
        one of its reasons); ``wake``: set when work may wait for the new module;
        ``errands``: the engine instance's, which run the compiles and installs."""
        self._ops = ops
        self._service = service
        self._compiler = compiler
        self._block_threads = block_threads
        self._wake = wake
        self._hold_changed = hold_changed
        self._errands = errands
        self._log = log
        self._install_lock = asyncio.Lock()
        self._stopping = False  # the engine stops: no install starts a swap any more
        self.arch = ""  # the device's, e.g. "sm_90" (set when the engine starts)
        self.modules_built = 0
        self.swapping = False  # an install is handing the ring to a new module

    async def first_image(self, arch: str) -> bytes:
        """The engine module image the engine starts with, for a device of ``arch``."""
        self.arch = arch
        image = await self.engine_image(self._ops.physical_ops(), self._ops.op_ids())
        self.modules_built = 1
        return image

    async def engine_image(self, ops: Sequence[OpSpec], ids: dict[str, int]) -> bytes:
        """The engine module image for ``ops``: from the memory cache on the loop (an
        install prepared ahead waits on no thread), else built in a worker thread."""
        arch, compiler, threads = self.arch, self._compiler, self._block_threads
        cached = cached_engine_module(
            ops, arch=arch, compiler=compiler, block_threads=threads, op_ids=ids
        )
        if cached is not None:
            return cached.image
        module, _engine = await asyncio.to_thread(
            functools.partial(
                build_engine_module,
                ops,
                arch=arch,
                compiler=compiler,
                block_threads=threads,
                op_ids=ids,
            )
        )
        return module.image

    # -------------------------------------------------------------- messages
    def prepare(self, msg: PrepareOp) -> Deferred[OpPrepared]:
        """Compile (and cache) the module an install of ``msg.op`` would load."""
        try:
            self._service.check_serving()
            ops, ids = self._ops.planned(msg.op)
        except GpuActorsError as exc:
            return failed_reply(exc)

        async def compile_ahead() -> OpPrepared:
            started = time.perf_counter()
            await self.engine_image(ops, ids)
            elapsed = (time.perf_counter() - started) * 1e3
            return OpPrepared(name=msg.op.name, version=msg.op.version, compile_ms=elapsed)

        return self._errands.reply_when(compile_ahead())

    def replace(self, msg: ReplaceOp) -> Deferred[OpInstalled]:
        """Install a new version of op ``msg.name`` with the fields ``msg`` changes."""

        def replacement() -> OpSpec:
            """The new version, numbered when its install begins: two replaces sent
            together become two versions, not one version twice."""
            current = self._ops.resolve(msg.name).spec
            return msg.applied_to(current, self._ops.next_version(msg.name))

        try:
            self._service.check_serving()  # (first: a stopped engine says so, whatever it is sent)
            replacement()  # refused at once if it is invalid now
        except GpuActorsError as exc:
            return failed_reply(exc)
        return self.install(replacement, activate=True)

    def install(self, op: OpSpec | Callable[[], OpSpec], activate: bool) -> Deferred[OpInstalled]:
        """Install ``op`` (a callable: built once the install's turn comes)."""
        try:
            self._service.check_serving()
        except GpuActorsError as exc:
            return failed_reply(exc)
        return self._errands.reply_when(self._install(op, activate))

    def alias(self, msg: AliasOp) -> OpAliasSet | Deferred[OpAliasSet]:
        """Point ``msg.name`` at an installed version; refused, the table unchanged,
        where the engine does not serve (as an install is: its tasks would never run)."""
        try:
            self._service.check_serving()
            previous = self._ops.alias(msg.name, msg.version)
        except GpuActorsError as exc:
            return failed_reply(exc)
        return OpAliasSet(name=msg.name, version=msg.version, previous=previous)

    def rollback(self, msg: Rollback) -> OpAliasSet | Deferred[OpAliasSet]:
        """Point ``msg.name`` back at its previous version; refused as :meth:`alias` is."""
        try:
            self._service.check_serving()
            now, was = self._ops.rollback(msg.name)
        except GpuActorsError as exc:
            return failed_reply(exc)
        return OpAliasSet(name=msg.name, version=now, previous=was)

    async def settle(self) -> None:
        """Wait for an install under way to end, and let none swap a module after it:
        the engine stops, and its runtime must not close under a module swap (nor the
        op table change after the engine stopped)."""
        self._stopping = True
        async with self._install_lock:
            pass

    @staticmethod
    def _stopped_before(op: OpSpec) -> EngineStopped:
        return EngineStopped(f"the engine stopped before op {op.name!r} was installed")

    async def _install(self, op: OpSpec | Callable[[], OpSpec], activate: bool) -> OpInstalled:
        """Compile a module with ``op`` added (off the mailbox; the old one keeps serving),
        then hand the ring over: park at a task boundary, load, relaunch on demand."""
        async with self._install_lock:
            if not isinstance(op, OpSpec):
                op = op()
            if self._stopping:  # (queued behind the stop's turn: not worth a compile)
                raise self._stopped_before(op)
            self._service.check_in_service()  # (faulted while queued: not worth one either)
            runtime = self._service.runtime
            assert runtime is not None
            ops, ids = self._ops.planned(op)  # raises before anything changes
            started = time.perf_counter()
            image = await self.engine_image(ops, ids)
            codecs = self._ops.codecs_for(op)  # its encoder and publisher, before the park
            compiled = time.perf_counter()
            if self._stopping:
                raise self._stopped_before(op)
            # Park without blocking the loop (tasks keep being accepted into the ring),
            # then load in a worker thread; the ring and every accepted task stay put.
            self.swapping = True
            self._hold_changed()
            try:
                runtime.request_park()
                service = self._service
                await wait_until(lambda: service.parked_or_faulted(runtime), "the engine to park")
                service.check_in_service()
                with prompt_handover():  # the loader must not wait 5 ms for the GIL
                    await asyncio.to_thread(runtime.swap_module, image)
            finally:
                self.swapping = False
                self._hold_changed()
            swapped = time.perf_counter()
            # A fault declared during the load: the op never serves (the engine is out
            # of service for good), so its asker gets the fault, not OpInstalled.
            self._service.check_in_service()
            self._ops.add(op, activate=activate, codecs=codecs)
            self.modules_built += 1
            self._wake.set()
            runtime.kick()
            self._log.info("op installed", op=op.name, version=op.version, active=activate)
            return OpInstalled(
                name=op.name,
                version=op.version,
                active=self._ops.active_version(op.name) == op.version,
                engine_module=self.modules_built,
                device_generation=self._service.generation,
                live_at=time.time(),
                compile_ms=(compiled - started) * 1e3,
                swap_pause_ms=(swapped - compiled) * 1e3,
            )


class Errands:
    """The tasks an engine instance starts to reply later (a Park's wait, a compile,
    an install, a shutdown), kept until each ends and cancelled when the instance
    stops.

    Nothing else holds or ends them (the loop keeps only weak references): one left
    running outlives its instance, and after a supervised restart, which builds a
    fresh instance on the same actor, it would go on with the old instance's state
    and context (a shutdown would stop the fresh instance)."""

    def __init__(self) -> None:
        self._running: set[asyncio.Task[Any]] = set()

    def start(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``work`` as a task of this instance's."""
        task = asyncio.get_running_loop().create_task(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    def reply_when(self, work: Coroutine[Any, Any, T]) -> Deferred[T]:
        """Run ``work`` as a task; the reply is its outcome (a cancel is ``EngineStopped``)."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def settle(done: asyncio.Task[T]) -> None:
            if future.done():
                return
            if done.cancelled():
                future.set_exception(EngineStopped("the engine stopped before this finished"))
            elif (error := done.exception()) is not None:
                future.set_exception(error)
            else:
                future.set_result(done.result())

        self.start(work).add_done_callback(settle)
        return Deferred(future)

    async def cancel(self) -> None:
        """Cancel every task still running, and wait until each has ended (the instance
        stops: what they would reply, or do, is no longer theirs to)."""
        running = list(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Yield to the loop until ``condition()`` holds; EngineError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise EngineError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0)
