"""The real worker's request handling (``WorkerHost``) without a process: a stream that
keeps what the host writes, and the values the worker tests send it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorSystem
from gpuactors.engine import (
    Completion,
    EnqueueBatch,
    Park,
    Parked,
    Resume,
    Shutdown,
    ShutdownReport,
)
from gpuactors.errors import EngineStopped, TaskFailed
from gpuactors.messages import Ack, Message
from gpuactors.worker import child as child_module
from gpuactors.worker.child import WorkerHost
from gpuactors.worker.frames import FrameStream
from gpuactors.worker.messages import RemoteKernel
from gpuactors.worker.wire import Answer, Boot, Failure, Frame, Ready, decode_frame


class Written:
    """A stand-in for the worker's stream: the frames written to it, decoded as the
    parent decodes them."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []

    def write(self, *buffers: bytes | memoryview) -> None:
        self.frames.append(decode_frame(b"".join(buffers)[4:]))


def host_and_stream(system: Any = None, engine: Any = None) -> tuple[WorkerHost, Written]:
    written = Written()
    host = WorkerHost(engine=engine, stream=written, system=system, device_id=0)  # type: ignore[arg-type]
    return host, written


def remote_kernel(kernel_id: int) -> RemoteKernel:
    return RemoteKernel(
        id=kernel_id, kernels={"k": "k"}, cache_key="", log="", generation=1, owner=""
    )


def answer(written: Written, rid: int) -> Any:
    """What the host answered request ``rid``: its value, or its error."""
    [frame] = [f for f in written.frames if isinstance(f, Answer | Failure) and f.rid == rid]
    return frame.value if isinstance(frame, Answer) else frame.error


def with_huge_code() -> TaskFailed:
    """An error with an attribute JSON refuses (an int over its 4300 digits)."""
    error = TaskFailed("fill", 1, 2)
    error.code = 10**5000
    return error


def batches_made(monkeypatch: pytest.MonkeyPatch) -> list[EnqueueBatch]:
    """Every EnqueueBatch validated from now on (a checked copy is one), in a list that
    grows as they are made."""
    made: list[EnqueueBatch] = []
    validated = EnqueueBatch.__init__

    def counted(self: EnqueueBatch, **fields: Any) -> None:
        made.append(self)
        validated(self, **fields)

    monkeypatch.setattr(EnqueueBatch, "__init__", counted)
    return made


# ------------------------------------------- a worker process around a stand-in engine
def _host_copy(_function: Any, value: Any) -> Any:
    """The worker's copies between host and device, as NumPy copies (no CuPy here)."""
    return np.array(value, copy=True)


async def serve_stand_in(fd: int, engine: Any, nvrtc: Any = None) -> None:
    """Run as a worker module's main: serve the real ``WorkerHost`` around ``engine`` (and
    ``nvrtc``, if given, for its NvrtcActor) as ``child.serve`` does after its boot, then
    leave as it does: at once, whatever still runs."""
    stream = await FrameStream.open(socket.socket(fileno=fd))
    assert isinstance(await stream.read(), Boot)
    child_module._device_call = _host_copy  # type: ignore[assignment]
    async with ActorSystem("worker") as system:
        host = child_module.WorkerHost(engine, stream, system, 0)
        if nvrtc is not None:
            host._nvrtc = nvrtc
        host.send(Ready(pid=os.getpid(), startup_s=0.0))
        stream.deliver(host.request_arrived, host.parent_left)
        await host.done.wait()
        with contextlib.suppress(ConnectionError):
            await stream.drain()
    child_module._exit(0)


class ParkingEngine:
    """The worker's engine: a Park holds every job until its Resume, and Shutdown ends
    every Park ("the drain runs the tasks a Park holds"), then drains; a forced one
    fails the jobs that have not run."""

    def __init__(self) -> None:
        self.ref = self  # (WorkerHost asks ``engine.ref``)
        self.parks = 0
        self.unparked = asyncio.Event()
        self.unparked.set()
        self.forced = False
        self.completed = 0
        self.jobs: set[asyncio.Future[None]] = set()

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        if isinstance(message, Park):
            self.parks += 1
            self.unparked.clear()
            return Parked(launches=1)
        if isinstance(message, Resume):
            self.parks = max(0, self.parks - 1)
            if not self.parks:
                self.unparked.set()
            return Ack()
        if isinstance(message, Shutdown):
            self.forced = message.force
            cancelled = len(self.jobs) if message.force else 0
            self.parks = 0
            self.unparked.set()
            await asyncio.gather(*self.jobs, return_exceptions=True)
            return ShutdownReport(completed=self.completed, cancelled=cancelled)
        raise TypeError(f"the stand-in engine does not handle {type(message).__name__}")

    async def enqueue(self, op: str, *args: Any, **_options: Any) -> Completion:
        """A fill of ``args[0]`` with ``args[1]``, once no Park holds the engine."""
        ran: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.jobs.add(ran)
        try:
            await self.unparked.wait()
            if self.forced:
                raise EngineStopped("the engine was shut down with force=True before this ran")
            await self.run_job(args)
            self.completed += 1
            return Completion(seq=self.completed, op=op, version=1, status=0, units=1, device_ns=1)
        finally:
            ran.set_result(None)
            self.jobs.discard(ran)

    async def run_job(self, args: tuple[Any, ...]) -> None:
        """What a job does once it may run: the fill."""
        args[0][...] = args[1]
