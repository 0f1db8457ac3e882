"""DeviceActor: NoCudaDevice where there is no GPU (CPU), and on a GPU its
properties, context rebuilds, generation watches and fault reports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

import pytest

from gpuactors.actors import ActorRef, ActorSystem, Props
from gpuactors.cuda import no_device_reason
from gpuactors.cuda.device import (
    ContextRebuilt,
    DeviceActor,
    DeviceInfo,
    DeviceStatus,
    GenerationChanged,
    RebuildContext,
    ReportFault,
    WatchGeneration,
    probe_device,
    start_device,
)
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.errors import ActorStopped, NoCudaDevice

NO_GPU = no_device_reason()
needs_no_gpu = pytest.mark.skipif(
    NO_GPU is None, reason="this machine has a GPU: the no-GPU behaviour cannot be seen here"
)
T = TypeVar("T")


def on_gpu(test: T) -> T:
    """Mark ``test`` as a GPU test, skipped (with the reason) where there is no GPU."""
    marked: T = pytest.mark.gpu(pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))(test))
    return marked


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("device-test") as system:
        yield system


# ------------------------------------------------------------------ no GPU
@needs_no_gpu
async def test_spawning_without_a_gpu_stops_with_no_cuda_device(system: ActorSystem) -> None:
    ref = system.spawn(Props(DeviceActor, kwargs={"device_id": 0}), name="gpu0")
    terminated = await asyncio.wait_for(system.watch(ref), 30)
    assert isinstance(terminated.cause, NoCudaDevice)
    assert "CUDA device 0 is not available" in str(terminated.cause)
    assert not ref.is_alive
    with pytest.raises(ActorStopped):
        await ref.ask(DeviceInfo(), timeout=5)


@needs_no_gpu
async def test_start_device_raises_no_cuda_device(system: ActorSystem) -> None:
    with pytest.raises(NoCudaDevice, match=str(NO_GPU)[:20]):
        await start_device(system, 0)


@needs_no_gpu
def test_probe_device_says_why() -> None:
    with pytest.raises(NoCudaDevice, match="not available"):
        probe_device(0)


# ---------------------------------------------------------------------- GPU
@pytest.fixture
async def device(system: ActorSystem) -> ActorRef:
    return await start_device(system, 0, name="gpu0")


@on_gpu
async def test_device_info(device: ActorRef) -> None:
    import cupy as cp

    status = await device.ask(DeviceInfo(), timeout=5, expect=DeviceStatus)
    props = cp.cuda.runtime.getDeviceProperties(0)
    assert status.device_id == 0 and status.sm_count == int(props["multiProcessorCount"])
    assert status.arch == f"sm_{cp.cuda.Device(0).compute_capability}"
    assert status.compute_capability == (int(props["major"]), int(props["minor"]))
    assert status.total_memory == int(props["totalGlobalMem"]) > 0 and status.name
    assert status.generation == GENERATIONS.current(0)
    assert status.health == "ok" and status.fault is None


@on_gpu
async def test_rebuild_starts_a_new_generation_and_wakes_watchers(device: ActorRef) -> None:
    before = GENERATIONS.current(0)
    watch = asyncio.ensure_future(device.ask(WatchGeneration(after=before), timeout=30))
    await asyncio.sleep(0.05)
    assert not watch.done()
    rebuilt = await device.ask(RebuildContext(reason="test"), timeout=60, expect=ContextRebuilt)
    assert (rebuilt.previous, rebuilt.generation, rebuilt.health) == (before, before + 1, "ok")
    assert await asyncio.wait_for(watch, 5) == GenerationChanged(generation=before + 1)
    # a watch for a generation already passed answers at once
    passed = await device.ask(WatchGeneration(after=before), timeout=5)
    assert passed.generation == before + 1
    status = await device.ask(DeviceInfo(), timeout=5, expect=DeviceStatus)
    assert status.generation == before + 1 == GENERATIONS.current(0)


@on_gpu
async def test_a_reported_fault_shows_until_a_rebuild(device: ActorRef) -> None:
    device.tell(ReportFault(reason="kernel k: illegal address"))
    status = await device.ask(DeviceInfo(), timeout=5, expect=DeviceStatus)
    assert status.health == "faulted" and status.fault == "kernel k: illegal address"
    rebuilt = await device.ask(RebuildContext(), timeout=60, expect=ContextRebuilt)
    assert rebuilt.health == "ok" and rebuilt.detail is None  # nothing really faulted
    status = await device.ask(DeviceInfo(), timeout=5, expect=DeviceStatus)
    assert status.health == "ok" and status.fault is None


@on_gpu
async def test_a_pending_watch_ends_with_the_actor(system: ActorSystem, device: ActorRef) -> None:
    watch = asyncio.ensure_future(
        device.ask(WatchGeneration(after=GENERATIONS.current(0)), timeout=30)
    )
    await asyncio.sleep(0.05)
    await system.stop(device, timeout=10)
    with pytest.raises(ActorStopped):
        await asyncio.wait_for(watch, 5)


@on_gpu
async def test_a_device_that_does_not_exist(system: ActorSystem) -> None:
    import cupy as cp

    count = cp.cuda.runtime.getDeviceCount()
    with pytest.raises(NoCudaDevice, match=f"no CUDA device {count}"):
        await start_device(system, count)
