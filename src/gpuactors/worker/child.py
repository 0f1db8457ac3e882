"""The worker process of an isolated engine: module ``gpuactors.worker``, its socket FD as argument.

It owns the CUDA context, runs an ordinary :class:`~gpuactors.engine.Engine` and
serves requests read from the socket ``FD``. When the engine faults or hangs the
context is lost for good (a primary-context reset leaves CuPy unusable, measured: see
"What the probes established" in ``docs/architecture.md``), so the worker reports it and exits; its
parent replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from typing import Any

import numpy as np

from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.cuda import no_device_reason
from gpuactors.cuda.arrays import view_of
from gpuactors.engine import Drain, Engine, EnqueueBatch, Shutdown
from gpuactors.errors import (
    ActorStopped,
    DeviceFault,
    GpuActorsError,
    GpuRefStale,
    NoCudaDevice,
    TaskHung,
    WorkerError,
    WorkerProtocolError,
)
from gpuactors.logs import get_logger
from gpuactors.messages import Ack, Message
from gpuactors.nvrtc import KernelHandle, NvrtcActor
from gpuactors.nvrtc.messages import CompileRequest, KernelReleased, Launch, ReleaseKernel
from gpuactors.worker.frames import FrameStream
from gpuactors.worker.messages import (
    BootSpec,
    Download,
    Free,
    Job,
    LaunchJob,
    ReleaseRemoteKernel,
    RemoteArray,
    Upload,
)
from gpuactors.worker.wire import (
    Answer,
    Boot,
    BootFailed,
    Failure,
    Faulted,
    Frame,
    FreeKernel,
    JobRan,
    KernelLoaded,
    LaunchRan,
    Ready,
    Request,
    describe,
    error_buffers,
    frame_buffers,
    wire_error,
)

#: How long a faulted worker keeps serving replies before it reports and exits.
_FAULT_FLUSH_SECONDS = 0.02
EXIT_FAULTED = 70

log = get_logger(component="worker")


class WorkerHost:
    """The engine of one worker process and the remote arrays it holds."""

    def __init__(
        self, engine: Engine, stream: FrameStream, system: ActorSystem, device_id: int
    ) -> None:
        self.engine = engine
        self._stream = stream
        self._system = system
        self._device_id = device_id
        self._arrays: dict[int, Any] = {}
        self._kernels: dict[int, KernelHandle] = {}
        self._last_id = 0  # arrays and kernels share one id sequence
        self._nvrtc: ActorRef | None = None  # spawned on the first compile
        self.fault: str | None = None
        self.done = asyncio.Event()
        self._serving: set[asyncio.Task[None]] = set()
        self._launching: set[asyncio.Task[None]] = set()  # LaunchJobs (a Drain waits for them)

    def send(self, frame: Frame) -> None:
        self._stream.write(*frame_buffers(frame))

    def request_arrived(self, frame: Frame) -> None:
        """Serve a request in a task of its own (requests run side by side)."""
        if self.done.is_set():  # stopping: the parent broke the protocol, or shut it down
            return
        if not isinstance(frame, Request):
            self.parent_left(
                WorkerProtocolError(f"the parent sent {type(frame).__name__}, not Request")
            )
            return
        task = asyncio.get_running_loop().create_task(self.serve(frame.rid, frame.message))
        self._serving.add(task)  # (the loop keeps only a weak reference)
        task.add_done_callback(self._serving.discard)
        if isinstance(frame.message, LaunchJob):
            self._launching.add(task)
            task.add_done_callback(self._launching.discard)

    def parent_left(self, why: Exception | None) -> None:
        """The stream from the parent ended: stop serving."""
        if isinstance(why, WorkerProtocolError):  # nothing more it sends can be understood
            log.error("the parent broke the worker protocol; the worker stops", error=str(why))
        else:
            log.info("the parent closed the connection; the worker stops", pid=os.getpid())
        self.done.set()

    async def serve(self, rid: int, message: Message) -> None:
        """Answer request ``rid``, always: its asker waits for nothing else."""

        def failure(error: GpuActorsError) -> Failure:
            return Failure(rid=rid, error=error)

        try:
            reply = await self._handle(message)
        except Exception as exc:
            if isinstance(exc, DeviceFault | TaskHung | ActorStopped):
                self._faulted(describe(exc))
            self._stream.write(*error_buffers(failure, wire_error(exc), keep_class=True))
            return
        try:
            answer = frame_buffers(Answer(rid=rid, value=reply))
        except Exception as exc:  # a reply this protocol cannot carry: our bug
            error = WorkerError(f"the worker's reply cannot be sent: {describe(exc)}")
            answer = error_buffers(failure, error)
        self._stream.write(*answer)
        if isinstance(message, Shutdown):
            self.done.set()

    async def _handle(self, message: Message) -> Any:
        if self.fault is not None:
            raise DeviceFault(f"this worker's device context faulted: {self.fault}")
        if isinstance(message, Job):
            return await self._run_job(message)
        if isinstance(message, LaunchJob):
            return await self._launch(message)
        if isinstance(message, CompileRequest):
            handle = await self._compiler().ask(message, timeout=None)
            kernel_id = self._new_id()
            self._kernels[kernel_id] = handle
            return KernelLoaded(
                id=kernel_id,
                kernels=dict(handle.kernels),
                cache_key=handle.cache_key,
                log=handle.log,
            )
        if isinstance(message, Upload):
            array_id = self._new_id()
            self._arrays[array_id] = _device_call(_to_device, message.array)
            return array_id
        if isinstance(message, Download):
            return _device_call(_to_host, self._remote(message.array))
        if isinstance(message, EnqueueBatch):
            # The engine's own arrays for the RemoteArrays that name them: not validated
            # again (the frame's batch was, and the engine checks its arrays as any batch's).
            args = tuple(self._remote(a) if isinstance(a, RemoteArray) else a for a in message.args)
            return await self.engine.ref.ask(message.same_values_copy(args=args), timeout=None)
        if isinstance(message, Free):
            self._remote(message.array)
            del self._arrays[message.array.id]
            return Ack()
        if isinstance(message, FreeKernel | ReleaseRemoteKernel):
            released = await self._release(message.kernel.id)
            return Ack() if isinstance(message, FreeKernel) else released
        if isinstance(message, Shutdown) and not message.force:
            return await self._drain_and_shut_down(message)
        if isinstance(message, Drain):
            await self._launches_ended()
        return await self.engine.ref.ask(message, timeout=None)

    async def _release(self, kernel_id: int) -> KernelReleased:
        """Drop the kernel here and release its handle in the NvrtcActor, which unloads
        the module when no other kernel of this worker holds it."""
        handle = self._kernels.pop(kernel_id, None)
        if handle is None:
            raise GpuRefStale(_stale_kernel(kernel_id), 0, 0)
        if self._nvrtc is None:  # (no compile ran here: nothing was loaded)
            return KernelReleased(holds_left=0, unloaded=True)
        released: KernelReleased = await self._nvrtc.ask(ReleaseKernel(kernel=handle), timeout=None)
        return released

    async def _drain_and_shut_down(self, shutdown: Shutdown) -> Any:
        """Shut the engine down, then finish every request accepted before ``shutdown``,
        its caller waiting or not: the worker exits once Shutdown is answered, and a
        compile or release still running would be cut (its caller got EngineStopped).

        Nothing here waits for a Resume: the engine's own Shutdown ends every Park and
        drains the tasks they held, and what is left runs beside the engine (NVRTC,
        copies). The parent sends no Drain while a Park holds the engine (it would wait
        for that Park), so this is the drain then."""
        accepted = {task for task in self._serving if task is not asyncio.current_task()}
        await self._launches_ended()
        report = await self.engine.ref.ask(shutdown, timeout=None)
        if accepted:
            await asyncio.wait(accepted)
        return report

    async def _launches_ended(self) -> None:
        """Wait for the kernel launches in flight now: a Drain (and a Shutdown, which
        drains) promises every task accepted so far, its caller waiting or not, and the
        engine knows only its own."""
        if self._launching:
            await asyncio.wait(set(self._launching))

    def _new_id(self) -> int:
        self._last_id += 1
        return self._last_id

    async def _run_job(self, job: Job) -> JobRan:
        args, copies = self._device_args(job.args)
        # (no ask timeout: the task's own deadline bounds it)
        completion = await self.engine.enqueue(
            job.op, *args, n=job.n, blocks=job.blocks, timeout=job.timeout
        )
        return JobRan(completion=completion, arrays=_returned(copies, job.returns, len(job.args)))

    async def _launch(self, job: LaunchJob) -> LaunchRan:
        handle = self._kernels.get(job.kernel.id)
        if handle is None:
            raise GpuRefStale(_stale_kernel(job.kernel.id), 0, 0)
        args, copies = self._device_args(job.args)
        launched = await self._compiler().ask(
            Launch(
                kernel=handle,
                name=job.name,
                grid=job.grid,
                block=job.block,
                args=args,
                shared_mem=job.shared_mem,
            ),
            timeout=None,
        )
        return LaunchRan(launched=launched, arrays=_returned(copies, job.returns, len(job.args)))

    def _device_args(self, host_args: tuple[Any, ...]) -> tuple[tuple[Any, ...], dict[int, Any]]:
        """The arguments as the device sees them, and the copies made of NumPy ones."""
        copies: dict[int, Any] = {}
        args: list[Any] = []
        for position, arg in enumerate(host_args):
            if isinstance(arg, np.ndarray):
                copies[position] = _device_call(_to_device, arg)
                args.append(copies[position])
            elif isinstance(arg, RemoteArray):
                args.append(self._remote(arg))
            else:
                args.append(arg)
        return tuple(args), copies

    def _compiler(self) -> ActorRef:
        if self._nvrtc is None:
            props = Props(NvrtcActor, kwargs={"device_id": self._device_id})
            self._nvrtc = self._system.spawn(props, name="nvrtc")
        return self._nvrtc

    def _remote(self, ref: RemoteArray) -> Any:
        array = self._arrays.get(ref.id)
        if array is None:
            raise GpuRefStale(f"remote array {ref.id} (freed or from another worker)", 0, 0)
        if ref.offset == 0 and tuple(array.shape) == ref.shape:
            return array
        return view_of(array, ref.offset, ref.shape)

    def _faulted(self, reason: str) -> None:
        if self.fault is None:
            self.fault = reason
            log.error("worker faulted", reason=reason, pid=os.getpid())
            asyncio.get_running_loop().call_later(_FAULT_FLUSH_SECONDS, self.done.set)


def _stale_kernel(kernel_id: int) -> str:
    return f"remote kernel {kernel_id} (freed or from another worker)"


def _returned(
    copies: dict[int, Any], returns: tuple[int, ...] | None, count: int
) -> tuple[Any, ...]:
    """One entry per argument: the copied-back array for returned positions, else None."""
    arrays: list[Any] = [None] * count
    for position in sorted(copies) if returns is None else returns:
        arrays[position] = _device_call(_to_host, copies[position])
    return tuple(arrays)


def _to_device(array: np.ndarray) -> Any:
    import cupy

    return cupy.asarray(array)


def _to_host(array: Any) -> np.ndarray:
    import cupy

    result: np.ndarray = cupy.asnumpy(array)
    return result


def _device_call(function: Any, value: Any) -> Any:
    """A CUDA copy; a CUDA error here means the context is gone: a DeviceFault."""
    import cupy

    try:
        return function(value)
    except (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError) as exc:
        raise DeviceFault(f"a copy between host and worker device failed: {exc}") from exc


async def serve(fd: int) -> int:
    """Boot the engine, serve requests until Shutdown, a fault or the parent leaving."""
    stream = await FrameStream.open(socket.socket(fileno=fd))
    frame = await stream.read()
    if not isinstance(frame, Boot):
        raise WorkerProtocolError(f"the parent began with {type(frame).__name__}, not Boot")
    boot: BootSpec = frame.spec
    started = time.perf_counter()
    async with ActorSystem("worker") as system:
        try:
            reason = no_device_reason()
            if reason is not None:
                raise NoCudaDevice(f"the worker process has no CUDA device: {reason}")
            # The worker serves one device: its uploads, downloads and launches are
            # all that device's, so it is the process's current device throughout.
            import cupy

            cupy.cuda.Device(boot.device_id).use()
            engine = await Engine.start(
                system,
                ops=boot.ops,
                config=boot.config,
                device_id=boot.device_id,
                full_policy=boot.full_policy,
            )
        except Exception as exc:  # e.g. NoCudaDevice: the parent raises it
            stream.write(
                *error_buffers(
                    lambda error: BootFailed(error=error), wire_error(exc), keep_class=True
                )
            )
            await stream.drain()
            return 1
        host = WorkerHost(engine, stream, system, boot.device_id)
        host.send(Ready(pid=os.getpid(), startup_s=time.perf_counter() - started))
        stream.deliver(host.request_arrived, host.parent_left)
        await host.done.wait()
        if host.fault is not None:
            host.send(Faulted(reason=host.fault))
            with contextlib.suppress(ConnectionError):
                await stream.drain()
            _exit(EXIT_FAULTED)  # never wait on a poisoned context's teardown
        with contextlib.suppress(ConnectionError):  # the parent may be gone already
            await stream.drain()
    return 0


def _exit(code: int) -> None:
    """Leave now, skipping interpreter teardown (a faulted context may block it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    _exit(asyncio.run(serve(int(sys.argv[1]))))
