"""Review fixes in gpuactors.worker: a compiled kernel whose asker left is freed in the
worker, and an error that cannot be encoded is still answered (by the worker, at its
boot, and by a Ray actor's link).

Run as a module (``IsolationConfig(worker_module=WORKER)``), this file is the CPU
stand-in worker of ``cpu_worker.py`` whose compiles answer after ``SLOW_S``. The tests
of ``WorkerHost`` drive the real worker's serving code on the CPU, with no engine: the
requests they send never reach one.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any

import numpy as np
import pytest

import cpu_worker
from gpuactors.actors import ActorSystem
from gpuactors.engine import Drain, Drained, EnqueueBatch, Stats
from gpuactors.errors import (
    AskTimeout,
    EngineError,
    GpuRefStale,
    TaskFailed,
    WorkerError,
)
from gpuactors.messages import Ack, Message
from gpuactors.nvrtc.messages import Compile, CompileAsync, CompileRequest
from gpuactors.nvrtc.options import NvrtcOpts
from gpuactors.worker import (
    IsolatedEngine,
    IsolationConfig,
    Job,
    LaunchJob,
    RemoteArray,
    RemoteKernel,
)
from gpuactors.worker import child as child_module
from gpuactors.worker.frames import FrameStream
from gpuactors.worker.link import Link, LinkAddress, LinkServer
from gpuactors.worker.messages import BootSpec
from gpuactors.worker.wire import (
    Answer,
    Boot,
    BootFailed,
    Failure,
    FreeKernel,
    frame_buffers,
)
from worker_host_cases import host_and_stream, remote_kernel, with_huge_code

WORKER = "test_worker_review_s35"
SLOW_S = 0.2
SOURCE = 'extern "C" __global__ void k(float* x) {}'


class SlowCompiles(cpu_worker.FakeWorker):
    async def handle(self, message: Any) -> Any:
        if isinstance(message, CompileRequest):
            await asyncio.sleep(SLOW_S)
        return await super().handle(message)


# ------------------------------------------------- a compile whose asker left
@pytest.mark.slow
@pytest.mark.usefixtures("cpu_worker_importable")
@pytest.mark.parametrize("kind", [Compile, CompileAsync])
async def test_a_compile_whose_asker_left_is_freed_in_the_worker(
    kind: type[CompileRequest],
) -> None:
    """Nobody learns the RemoteKernel of a compile whose asker left, so nobody could free
    it: the worker held that kernel for good (there was no request to drop one)."""
    isolation = IsolationConfig(worker_module=WORKER, standbys=0, start_timeout_s=30.0)
    message = kind(source=SOURCE, kernel_names=("k",), opts=NvrtcOpts(arch="sm_80"))
    async with ActorSystem("compiles") as system:
        engine = await IsolatedEngine.start(system, isolation=isolation)
        with pytest.raises(AskTimeout):
            await engine.ref.ask(message, timeout=SLOW_S / 4)
        # Answered after the first (both wait SLOW_S), so the first one's undo went before.
        second: RemoteKernel = await engine.ref.ask(message)
        lost = second.model_copy(update={"id": second.id - 1})
        with pytest.raises(WorkerError, match="KeyError"):  # the stand-in has no such kernel
            await engine.launch(lost, 1, 32, np.ones(4, np.float32))
        launched = await engine.launch(second, 1, 32, np.ones(4, np.float32))
        assert launched.launched.name == "k"
        await engine.shutdown()


# ------------------------------------------------------- the real worker's code
async def test_the_worker_drops_the_kernel_it_is_told_to_free() -> None:
    host, written = host_and_stream()
    host._kernels[3] = object()  # type: ignore[assignment]  # (a KernelHandle, never used)
    host._kernels[4] = object()  # type: ignore[assignment]
    await host.serve(1, FreeKernel(kernel=remote_kernel(3)))
    assert written.frames == [Answer(rid=1, value=Ack())]
    assert list(host._kernels) == [4]
    await host.serve(2, FreeKernel(kernel=remote_kernel(3)))
    launch = LaunchJob(kernel=remote_kernel(3), grid=1, block=32, args=(np.ones(4, np.float32),))
    await host.serve(3, launch)
    for rid, frame in enumerate(written.frames[1:], start=2):
        assert isinstance(frame, Failure) and frame.rid == rid
        assert isinstance(frame.error, GpuRefStale)
        assert "remote kernel 3 (freed" in str(frame.error)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class UnprintableGpuError(WorkerError):
    def __str__(self) -> str:
        raise RuntimeError("no text")


# The library's own error classes arrive as themselves, without their attributes;
# any other class as a WorkerError that names it.
UNSENDABLE = [
    (with_huge_code, TaskFailed, "op 'fill' failed task 1 with status code 2 (it could not"),
    (Unprintable, WorkerError, "Unprintable: <its text could not be made: RuntimeError>"),
    (
        UnprintableGpuError,
        WorkerError,
        "UnprintableGpuError: <its text could not be made: RuntimeError>",
    ),
]


@pytest.mark.parametrize(("make", "kind", "text"), UNSENDABLE)
async def test_an_error_that_cannot_be_encoded_is_still_answered(
    make: Any, kind: type[Exception], text: str
) -> None:
    """The worker sent nothing: encoding the Failure raised in the request's task, and
    its asker waited for good (until the deadline watchdog, for a request that has one)."""
    host, written = host_and_stream()
    error = make()

    async def failing(_message: Message) -> Any:
        raise error

    host._handle = failing  # type: ignore[method-assign]
    await host.serve(5, Stats())
    [frame] = written.frames
    assert isinstance(frame, Failure) and frame.rid == 5
    assert type(frame.error) is kind
    assert text in str(frame.error)


class Exploding(dict[str, Any]):
    def items(self) -> Any:
        raise LookupError("no items")


async def test_a_reply_whose_encoding_raises_is_answered_with_a_worker_error() -> None:
    host, written = host_and_stream()

    async def replying(_message: Message) -> Any:
        return Exploding()

    host._handle = replying  # type: ignore[method-assign]
    await host.serve(6, Stats())
    [frame] = written.frames
    assert isinstance(frame, Failure) and frame.rid == 6
    assert isinstance(frame.error, WorkerError)
    assert "the worker's reply cannot be sent: LookupError: no items" in str(frame.error)


async def test_a_boot_error_that_cannot_be_encoded_still_fails_the_boot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker raised instead of sending BootFailed: its parent waited for the whole
    start timeout, then learned nothing of why."""

    def no_device_reason() -> str | None:
        raise with_huge_code()

    monkeypatch.setattr(child_module, "no_device_reason", no_device_reason)
    parent_end, worker_end = socket.socketpair()
    parent = await FrameStream.open(parent_end)
    parent.write(*frame_buffers(Boot(spec=BootSpec())))
    status = await asyncio.wait_for(child_module.serve(worker_end.detach()), 10)
    frame = await asyncio.wait_for(parent.read(), 5)
    parent.close()
    assert status == 1
    assert isinstance(frame, BootFailed) and type(frame.error) is TaskFailed
    assert "op 'fill' failed task 1" in str(frame.error)


async def test_a_link_answers_an_error_that_cannot_be_encoded() -> None:
    """A Ray actor's link had the same gap: its caller's batch waited for good."""

    async def failing(_message: Message) -> Any:
        raise with_huge_code()

    server = LinkServer(failing)
    address = await server.start("127.0.0.1")
    assert isinstance(address, LinkAddress)
    link = await Link.connect(address, "actor 0")
    remote = RemoteArray(id=1, shape=(4,), dtype="<f4", generation=1, owner="test")
    batch = EnqueueBatch(op="fill", args=(remote, 1.0), n=1, offsets={"out": range(4)})
    with pytest.raises(EngineError, match="the Ray actor's link raised TaskFailed") as raised:
        await asyncio.wait_for(link.ask(batch), 5)
    assert not isinstance(raised.value, TaskFailed)  # the plain stand-in, not a half of it
    link.close()
    server.close()


if __name__ == "__main__":
    cpu_worker.FakeWorker = SlowCompiles  # type: ignore[misc,assignment]
    asyncio.run(cpu_worker.main(int(sys.argv[1])))


# ------------------------------------------------- a drain waits for abandoned work
@pytest.mark.slow
@pytest.mark.usefixtures("cpu_worker_importable")
async def test_a_drain_waits_for_a_job_whose_caller_left() -> None:
    """Drain promises every task accepted so far, its caller waiting or not. The isolated
    engine waited only for the requests whose callers still waited, then asked for
    Stats: a job whose caller had timed out was still running in the worker."""
    isolation = IsolationConfig(worker_module="cpu_worker", standbys=0, start_timeout_s=30.0)
    async with ActorSystem("drains") as system:
        engine = await IsolatedEngine.start(system, isolation=isolation)
        with pytest.raises(AskTimeout):  # "slow" runs 0.6 s in the CPU worker
            await engine.ref.ask(
                Job(op="slow", args=(np.zeros(4, np.float32), 1.0), n=4), timeout=0.05
            )
        loop = asyncio.get_running_loop()
        started = loop.time()
        drained = await engine.ref.ask(Drain(), timeout=10, expect=Drained)
        assert loop.time() - started > 0.3
        assert drained.processed == 1
        await engine.shutdown()
