"""The engines of a group: one per device, in this process or in a worker process each.

An EngineGroup (and a Ray actor hosting an engine) talks to its engines through
this one interface, :class:`EngineMember`, so either kind can serve: a
:class:`LocalMember` runs the engine on this process's event loop (the cheapest
path per task, but every device shares this one loop); an :class:`IsolatedMember`
runs it in a worker process of its own (a loop per device, and a device fault is
recovered without touching this process).
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, Protocol, TypeVar

import numpy as np

from gpuactors.actors import ActorSystem
from gpuactors.cuda import status as cuda_status
from gpuactors.cuda.arrays import check_view, view_of
from gpuactors.cuda.current import on_device
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.engine import Completion, Engine, EngineConfig, Enqueue, OpSpec, ShutdownReport
from gpuactors.errors import DeviceFailed, DeviceFault, EngineStopped, InvalidArgument
from gpuactors.messages import Message
from gpuactors.worker import IsolatedEngine, IsolationConfig, Job, JobResult, RemoteArray

T = TypeVar("T")


class EngineMember(Protocol):
    """One engine of a group (on one device: in this process, a worker, or a Ray actor)."""

    isolated: bool  # the engine runs in another process (its arrays are RemoteArrays)

    @property
    def key(self) -> int:
        """The engine's key in its group: its device id (a Ray actor's index in a pool)."""
        ...

    @property
    def serving(self) -> bool:
        """False once the engine can serve no more (a fault it cannot recover, a stop)."""
        ...

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        """Send an engine message (EnqueueBatch, InstallOp, Stats...) and await its reply."""
        ...

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
        """Run one task as a :class:`Job` does: NumPy arrays by value (copied to the device
        and back for ``returns``), this engine's own arrays in place, scalars."""
        ...

    async def upload(self, host: np.ndarray) -> Any:
        """Copy ``host`` to this engine's device: the array an engine task can use."""
        ...

    async def download(self, array: Any) -> np.ndarray: ...

    async def free(self, array: Any) -> None: ...

    def view(self, array: Any, offset: int, shape: tuple[int, ...]) -> Any:
        """``shape`` elements of ``array`` from element ``offset`` on (contiguous)."""
        ...

    async def stop(self, *, force: bool = False) -> ShutdownReport: ...


class LocalMember:
    """An engine on this process's event loop (``Engine``): device arrays are CuPy arrays."""

    isolated = False

    def __init__(self, engine: Engine, device_id: int) -> None:
        self.engine = engine
        self.ref = engine.ref
        self.device_id = device_id
        self._generation = GENERATIONS.current(device_id)
        self._stopped = False

    @classmethod
    async def start(
        cls,
        system: ActorSystem,
        *,
        device_id: int,
        ops: Sequence[OpSpec] = (),
        config: EngineConfig | None = None,
        name: str = "engine",
        full_policy: Literal["wait", "fail"] = "wait",
    ) -> LocalMember:
        engine = await Engine.start(
            system, ops=ops, config=config, name=name, device_id=device_id, full_policy=full_policy
        )
        return cls(engine, device_id)

    @property
    def key(self) -> int:
        return self.device_id

    @property
    def serving(self) -> bool:
        # A fault moves the device's generation for good: this process cannot rebuild it.
        return not self._stopped and GENERATIONS.current(self.device_id) == self._generation

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        if type(message) is Enqueue and timeout is None:
            return await self._enqueue(message)
        return await self.ref.ask(message, timeout=timeout)

    async def _enqueue(self, task: Enqueue) -> Completion:
        """``task`` through the engine client's own path, where concurrent callers' tasks
        are handed over together (one Submit per loop turn), not as a message each."""
        return await self.engine.enqueue(
            task.op, *task.args, n=task.n, blocks=task.blocks, timeout=task.timeout,
            after=task.after,
        )  # fmt: skip

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
        copies: dict[int, Any] = {}
        device_args: list[Any] = []
        for position, arg in enumerate(args):
            if isinstance(arg, RemoteArray):
                raise InvalidArgument(
                    f"argument {position} is a RemoteArray: an engine in this process takes "
                    "NumPy arrays (by value) or its device's own arrays"
                )
            if isinstance(arg, np.ndarray):
                arg = copies[position] = self._to_device(arg)
            device_args.append(arg)
        task = Enqueue(
            op=op, args=tuple(device_args), n=n, blocks=blocks, timeout=timeout, after="none"
        )  # (the copies are complete: _to_device waits for them)
        completion = await self._enqueue(task)
        wanted = tuple(copies) if returns is None else returns
        arrays = tuple(
            self._to_host(copies[p]) if p in copies and p in wanted else None
            for p in range(len(device_args))
        )
        generation = GENERATIONS.current(self.device_id)
        return JobResult(completion=completion, arrays=arrays, generation=generation, attempts=1)

    async def upload(self, host: np.ndarray) -> Any:
        return self._to_device(host)

    async def download(self, array: Any) -> np.ndarray:
        return self._to_host(array)

    async def free(self, array: Any) -> None:
        """Nothing to do: CuPy frees an array when its last reference goes."""

    def view(self, array: Any, offset: int, shape: tuple[int, ...]) -> Any:
        return view_of(array, offset, shape)

    async def stop(self, *, force: bool = False) -> ShutdownReport:
        self._stopped = True
        return await self.engine.shutdown(force=force, timeout=120.0)

    def _to_device(self, host: np.ndarray) -> Any:
        """A copy of ``host`` on this device, complete when this returns (the engine may
        read it at once: its tasks are sent with ``after="none"``)."""
        with self._copying("an upload"):
            import cupy

            array = cupy.asarray(np.ascontiguousarray(host))
            cupy.cuda.get_current_stream().synchronize()
        return array

    def _to_host(self, array: Any) -> np.ndarray:
        with self._copying("a download"):
            import cupy

            host: np.ndarray = cupy.asnumpy(array)
        return host

    @contextmanager
    def _copying(self, what: str) -> Iterator[None]:
        """A copy to or from this device, refused with DeviceFault as the engine refuses
        its tasks once the device faulted: the context is poisoned for this process, so
        CUDA would answer the copy with the fault's own error (a sticky one, or a fault
        the engine has not seen yet: a kernel of the caller's)."""
        if GENERATIONS.current(self.device_id) != self._generation:
            raise DeviceFault(
                f"{what} to device {self.device_id} is refused: the device faulted, and "
                "this process cannot use it again (an isolated group recovers)"
            )
        try:
            with on_device(self.device_id):
                yield
        except Exception as exc:
            if getattr(exc, "status", None) in cuda_status.STICKY:
                raise DeviceFault(
                    f"{what} on device {self.device_id} failed: {exc} (the device's "
                    "context is poisoned: this process cannot use it again)"
                ) from exc
            raise


class IsolatedMember:
    """An engine in a supervised worker process (``IsolatedEngine``): its arrays are
    RemoteArrays, and a device fault is recovered by a new worker."""

    isolated = True

    def __init__(self, engine: IsolatedEngine, device_id: int) -> None:
        self.engine = engine
        self.ref = engine.ref
        self.device_id = device_id
        self._failure: str | None = None

    @classmethod
    async def start(
        cls,
        system: ActorSystem,
        *,
        device_id: int,
        ops: Sequence[OpSpec] = (),
        config: EngineConfig | None = None,
        isolation: IsolationConfig | None = None,
        name: str = "isolated-engine",
    ) -> IsolatedMember:
        engine = await IsolatedEngine.start(
            system, ops=tuple(ops), config=config, isolation=isolation, name=name,
            device_id=device_id,
        )  # fmt: skip
        return cls(engine, device_id)

    @property
    def key(self) -> int:
        return self.device_id

    @property
    def serving(self) -> bool:
        return self._failure is None

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        return await self._watched(self.ref.ask(message, timeout=timeout))

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
        result: JobResult = await self._watched(self.ref.ask(job))
        return result

    async def upload(self, host: np.ndarray) -> RemoteArray:
        return await self._watched(self.engine.upload(host))

    async def download(self, array: Any) -> np.ndarray:
        return await self._watched(self.engine.download(array))

    async def free(self, array: Any) -> None:
        await self._watched(self.engine.free(array))

    def view(self, array: Any, offset: int, shape: tuple[int, ...]) -> Any:
        return remote_view(array, offset, shape)

    async def stop(self, *, force: bool = False) -> ShutdownReport:
        self._failure = "stopped"
        return await self.engine.shutdown(force=force)

    async def _watched(self, pending: Awaitable[T]) -> T:
        """``pending``'s outcome; an engine that failed for good (its restart budget is
        spent) or stopped is out of the group's service from then on."""
        try:
            return await pending
        except (DeviceFailed, EngineStopped) as exc:
            self._failure = f"{type(exc).__name__}: {exc}"
            raise


def remote_view(array: RemoteArray, offset: int, shape: tuple[int, ...]) -> RemoteArray:
    """``shape`` elements of a RemoteArray from element ``offset`` on: the process that
    holds the array resolves the view when it uses it. Checked here, as ``model_copy``
    does not check (a negative offset or extent would make a RemoteArray its own model
    refuses)."""
    check_view(offset, shape, array.size)
    return array.model_copy(update={"offset": array.offset + offset, "shape": shape})
