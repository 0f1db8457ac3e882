"""Review fixes in gpuactors.worker and gpuactors.nvrtc: a compiled kernel can be given
back (``ReleaseKernel``, ``ReleaseRemoteKernel``), a worker's ``Drain`` waits for its
kernel launches, and an error the worker cannot encode keeps its gpuactors class.

Run as a module (``IsolationConfig(worker_module=WORKER)``), this file is the CPU
stand-in worker of ``cpu_worker.py`` that also answers ``ReleaseRemoteKernel``. The
tests of ``WorkerHost`` drive the real worker's serving code on the CPU.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

import cpu_worker
from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.cuda import no_device_reason
from gpuactors.engine import Drain, Drained, Stats
from gpuactors.errors import (
    AskTimeout,
    GpuActorsError,
    GpuRefStale,
    NoCudaDevice,
    TaskFailed,
    WorkerError,
    WrongDevice,
)
from gpuactors.messages import Ack, Message
from gpuactors.nvrtc import (
    Compile,
    CompilerStats,
    KernelCompiler,
    KernelHandle,
    KernelReleased,
    Launch,
    Launched,
    NvrtcActor,
    NvrtcOpts,
    NvrtcStats,
    ReleaseKernel,
)
from gpuactors.worker import (
    IsolatedEngine,
    IsolationConfig,
    LaunchJob,
    ReleaseRemoteKernel,
)
from gpuactors.worker import child as child_module
from gpuactors.worker.frames import FrameStream
from gpuactors.worker.messages import BootSpec
from gpuactors.worker.wire import (
    Boot,
    BootFailed,
    Failure,
    FreeKernel,
    LaunchRan,
    Request,
    frame_buffers,
)
from worker_host_cases import answer, host_and_stream, remote_kernel, with_huge_code

WORKER = "test_worker_nvrtc_review_s36"
NO_GPU = no_device_reason()
SOURCE = 'extern "C" __global__ void k() {}'
#: For the device where there is one; else an arch, so that compiles run with no GPU.
SM90 = NvrtcOpts() if NO_GPU is None else NvrtcOpts(arch="sm_90")


# ------------------------------------------------------------- the NvrtcActor
@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("s36") as system:
        yield system


@pytest.fixture
def compiler() -> KernelCompiler:
    return KernelCompiler(disk=False)  # memory only: a recompile is seen in its counter


def nvrtc_actor(system: ActorSystem, compiler: KernelCompiler, name: str = "nvrtc") -> ActorRef:
    return system.spawn(Props(NvrtcActor, kwargs={"compiler": compiler}), name=name)


async def compiled(ref: ActorRef) -> KernelHandle:
    message = Compile(source=SOURCE, kernel_names=("k",), opts=SM90)
    return await ref.ask(message, timeout=60, expect=KernelHandle)


async def release(ref: ActorRef, handle: KernelHandle) -> KernelReleased:
    return await ref.ask(ReleaseKernel(kernel=handle), expect=KernelReleased)


async def launch_is_not_refused(ref: ActorRef, handle: KernelHandle) -> None:
    """The handle passes every check a Launch makes (where there is no GPU, the launch
    itself then fails with NoCudaDevice)."""
    launch = Launch(kernel=handle, grid=1, block=32)
    if NO_GPU is None:
        assert isinstance(await ref.ask(launch, timeout=30), Launched)
    else:
        with pytest.raises(NoCudaDevice):
            await ref.ask(launch)


async def test_a_released_handle_is_refused_and_the_last_release_unloads_the_module(
    system: ActorSystem, compiler: KernelCompiler
) -> None:
    """There was no way to give a compiled kernel back: its module stayed loaded, and
    in the memory cache, for the actor's life."""
    ref = nvrtc_actor(system, compiler)
    first, second = await compiled(ref), await compiled(ref)
    assert second.origin == "memory" and second.module is first.module  # one module, two holds
    key = first.cache_key

    assert await release(ref, first) == KernelReleased(holds_left=1, unloaded=False)
    assert key in compiler.memory  # the other handle still holds it
    with pytest.raises(GpuRefStale, match=r"'kernel\.cu' was released"):
        await ref.ask(Launch(kernel=first, grid=1, block=32))
    with pytest.raises(GpuRefStale, match="was released"):
        await release(ref, first)  # twice: a bug of the caller's, said so
    await launch_is_not_refused(ref, second)

    assert await release(ref, second) == KernelReleased(holds_left=0, unloaded=True)
    assert key in compiler.memory  # the image stays: the process's actors share it
    with pytest.raises(GpuRefStale, match="was released"):
        await ref.ask(Launch(kernel=second, grid=1, block=32))
    again = await compiled(ref)
    assert again.origin == "memory" and compiler.compiles == 1  # loaded again, no NVRTC
    await launch_is_not_refused(ref, again)


async def test_a_handle_the_actor_did_not_reply_holds_nothing_there(
    system: ActorSystem, compiler: KernelCompiler
) -> None:
    mine, other = nvrtc_actor(system, compiler), nvrtc_actor(system, compiler, "other")
    handle = await compiled(mine)
    assert await release(other, handle) == KernelReleased(holds_left=0, unloaded=True)
    with pytest.raises(GpuRefStale, match="was released"):
        await other.ask(Launch(kernel=handle, grid=1, block=32))
    await launch_is_not_refused(mine, handle)  # released there, not here
    elsewhere = nvrtc_actor_on(system, compiler, device_id=1)
    with pytest.raises(WrongDevice, match="this actor owns device 1"):
        await release(elsewhere, handle)


def nvrtc_actor_on(system: ActorSystem, compiler: KernelCompiler, device_id: int) -> ActorRef:
    props = Props(NvrtcActor, kwargs={"compiler": compiler, "device_id": device_id})
    return system.spawn(props, name=f"nvrtc-{device_id}")


# ------------------------------------------------------- the real worker's code
async def test_the_worker_releases_its_kernels_in_its_nvrtc_actor(
    system: ActorSystem, compiler: KernelCompiler
) -> None:
    host, written = host_and_stream()
    host._nvrtc = nvrtc_actor(system, compiler)  # (its own would use the user's disk cache)
    for rid in (1, 2, 3):
        await host.serve(rid, Compile(source=SOURCE, kernel_names=("k",), opts=SM90))
    ids = [answer(written, rid).id for rid in (1, 2, 3)]
    key = answer(written, 1).cache_key

    await host.serve(4, ReleaseRemoteKernel(kernel=remote_kernel(ids[0])))
    assert answer(written, 4) == KernelReleased(holds_left=2, unloaded=False)
    await host.serve(5, FreeKernel(kernel=remote_kernel(ids[1])))  # the engine's undo releases too
    assert answer(written, 5) == Ack()
    await host.serve(6, ReleaseRemoteKernel(kernel=remote_kernel(ids[2])))
    assert answer(written, 6) == KernelReleased(holds_left=0, unloaded=True)
    assert key in compiler.memory  # the image stays cached: only the module is unloaded
    await host.serve(7, ReleaseRemoteKernel(kernel=remote_kernel(ids[2])))
    assert isinstance(answer(written, 7), GpuRefStale)


class EngineRef:
    """The worker engine's ref: it drains at once (it runs none of the launches)."""

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        assert isinstance(message, Drain)
        return Drained(processed=0)


class SlowNvrtc:
    """The worker NvrtcActor's ref: a launch completes when the test says so."""

    def __init__(self) -> None:
        self.finish = asyncio.Event()

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        assert isinstance(message, Launch)
        await self.finish.wait()
        return Launched(name="k", symbol="k")


async def test_a_worker_drain_waits_for_its_kernel_launches(
    system: ActorSystem, compiler: KernelCompiler
) -> None:
    """A LaunchJob runs on the worker's NvrtcActor, not its engine: the worker's Drain
    asked only the engine, so it answered while a launch (whose caller had left) ran."""
    handle = await compiled(nvrtc_actor(system, compiler))
    host, written = host_and_stream(engine=type("Engine", (), {"ref": EngineRef()})())
    nvrtc = SlowNvrtc()
    host._nvrtc = nvrtc  # type: ignore[assignment]
    host._kernels[1] = handle
    host.request_arrived(
        Request(rid=1, message=LaunchJob(kernel=remote_kernel(1), grid=1, block=32))
    )
    host.request_arrived(Request(rid=2, message=Drain()))
    await asyncio.sleep(0.1)
    assert written.frames == []  # the drain waits for the launch
    nvrtc.finish.set()
    for _ in range(100):
        if len(written.frames) == 2:
            break
        await asyncio.sleep(0.01)
    assert [frame.rid for frame in written.frames] == [1, 2]  # type: ignore[union-attr]
    assert isinstance(answer(written, 1), LaunchRan)
    assert answer(written, 2) == Drained(processed=0)


class NotOurs(GpuActorsError):
    """A GpuActorsError subclass that is not one of gpuactors.errors."""


def not_ours() -> NotOurs:
    error = NotOurs("its own text")
    error.detail = 10**5000  # type: ignore[attr-defined]
    return error


async def failure_of(error: GpuActorsError) -> GpuActorsError:
    host, written = host_and_stream()

    async def failing(_message: Message) -> Any:
        raise error

    host._handle = failing  # type: ignore[method-assign]
    await host.serve(5, Stats())
    [frame] = written.frames
    assert isinstance(frame, Failure) and frame.rid == 5
    return frame.error


async def test_an_error_that_cannot_be_encoded_keeps_its_gpuactors_class() -> None:
    """It reached the parent as a WorkerError: a caller catching TaskFailed missed it."""
    error = await failure_of(with_huge_code())
    assert type(error) is TaskFailed
    assert str(error).startswith("op 'fill' failed task 1 with status code 2 (it could not")
    assert "sent without attributes: InvalidArgument: it cannot be encoded" in str(error)
    assert not hasattr(error, "code")


async def test_an_unencodable_error_of_another_class_is_still_a_worker_error() -> None:
    error = await failure_of(not_ours())
    assert type(error) is WorkerError
    assert "NotOurs: its own text (it could not be sent as it was" in str(error)


async def test_a_boot_error_that_cannot_be_encoded_keeps_its_class(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
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


# --------------------------------------------- ReleaseRemoteKernel, end to end
class Releasing(cpu_worker.FakeWorker):
    """The CPU worker, answering ReleaseRemoteKernel as the real one does."""

    async def handle(self, message: Any) -> Any:
        if isinstance(message, ReleaseRemoteKernel):
            del self.kernels[message.kernel.id]  # (KeyError for one it does not hold)
            return KernelReleased(holds_left=0, unloaded=True)
        return await super().handle(message)


if __name__ == "__main__":
    cpu_worker.FakeWorker = Releasing  # type: ignore[misc]
    asyncio.run(cpu_worker.main(int(sys.argv[1])))


@pytest.mark.slow
@pytest.mark.usefixtures("cpu_worker_importable")
async def test_an_isolated_engine_releases_a_remote_kernel() -> None:
    isolation = IsolationConfig(worker_module=WORKER, standbys=0, start_timeout_s=30.0)
    async with ActorSystem("releases") as system:
        engine = await IsolatedEngine.start(system, isolation=isolation)
        kernel = await engine.compile(SOURCE, "k", opts=SM90)
        assert await engine.release_kernel(kernel) == KernelReleased(holds_left=0, unloaded=True)
        with pytest.raises(WorkerError, match="KeyError"):  # the stand-in holds it no more
            await engine.launch(kernel, 1, 32)
        other = kernel.model_copy(update={"owner": "another engine"})
        with pytest.raises(GpuRefStale, match="of another engine instance"):
            await engine.release_kernel(other)  # refused before anything is sent
        await engine.shutdown()


# ------------------------------------------------------------------------ GPU
SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))
async def test_gpu_releasing_the_last_handle_unloads_its_module(
    system: ActorSystem, compiler: KernelCompiler
) -> None:
    ref = nvrtc_actor(system, compiler)
    message = Compile(source=SOURCE, kernel_names=("k",))
    first = await ref.ask(message, timeout=60, expect=KernelHandle)
    second = await ref.ask(message, timeout=60, expect=KernelHandle)
    for handle in (first, second):
        await ref.ask(Launch(kernel=handle, grid=1, block=32), timeout=30, expect=Launched)

    async def loaded() -> int:
        return (await ref.ask(CompilerStats(), expect=NvrtcStats)).loaded_modules

    assert await loaded() == 1
    assert not (await release(ref, first)).unloaded
    assert await loaded() == 1
    await ref.ask(Launch(kernel=second, grid=1, block=32), timeout=30, expect=Launched)
    assert (await release(ref, second)).unloaded
    assert await loaded() == 0
    with pytest.raises(GpuRefStale, match="was released"):
        await ref.ask(Launch(kernel=second, grid=1, block=32), timeout=30)
    fresh = await ref.ask(message, timeout=60, expect=KernelHandle)
    await ref.ask(Launch(kernel=fresh, grid=1, block=32), timeout=30, expect=Launched)
    assert await loaded() == 1


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))
async def test_gpu_a_release_while_an_engine_kernel_runs_neither_hangs_nor_stops_it(
    system: ActorSystem, compiler: KernelCompiler
) -> None:
    """Unloading a module, like loading one, may wait for every kernel running on the
    device: with a persistent engine kernel running that would be for good."""
    import cupy as cp

    from gpuactors.engine import Engine, EngineConfig

    engine = await Engine.start(system, config=EngineConfig(idle_park_ms=60_000.0))
    out = cp.zeros(4, dtype=cp.float32)
    await engine.enqueue("fill", out, 1.0, n=4)  # the engine's kernel runs from here on
    ref = nvrtc_actor(system, compiler)
    handle = await ref.ask(Compile(source=SOURCE, kernel_names=("k",)), timeout=60)
    await ref.ask(Launch(kernel=handle, grid=1, block=32), timeout=30, expect=Launched)
    released = await asyncio.wait_for(release(ref, handle), 10)
    assert released.unloaded
    await asyncio.sleep(0.05)  # (a module freed late, by the collector, as well)
    done = await asyncio.wait_for(engine.enqueue("fill", out, 2.0, n=4), 10)
    assert done.status == 0 and bool((out == 2.0).all())
    await engine.shutdown()


@pytest.mark.gpu
@pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))
async def test_gpu_an_isolated_drain_waits_for_a_launch_whose_caller_left() -> None:
    async with ActorSystem("drain-gpu", shutdown_timeout=30) as system:
        engine = await IsolatedEngine.start(system, isolation=IsolationConfig(standbys=0))
        kernel = await engine.compile(SPIN, "spin")
        spinning = LaunchJob(kernel=kernel, grid=1, block=1, args=(np.int64(1_000_000_000),))
        await engine.ref.ask(spinning, timeout=60)  # loads the module; about 0.5 s
        with pytest.raises(AskTimeout):
            await engine.ref.ask(spinning, timeout=0.05)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await engine.drain(timeout=60)
        assert loop.time() - started > 0.2  # the abandoned launch was still spinning
        assert (await engine.release_kernel(kernel)).unloaded
        with pytest.raises(GpuRefStale, match="freed"):
            await engine.launch(kernel, 1, 1, np.int64(1))
        await engine.shutdown()
