"""Engine defects found by review (session 34), on the host ring (no GPU): the hang
check after a park, a Park's name taken again, and bad input on the task paths that
had failed the actor's handler (a restart fails every task in flight)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import nullcontext
from typing import Any

import pytest

from gpuactors.actors import Actor, ActorSystem, Props, handles
from gpuactors.engine import abi
from gpuactors.engine import streams as streams_module
from gpuactors.engine.client import Engine
from gpuactors.engine.host_runtime import CupyLikeArray, HostRuntime
from gpuactors.engine.messages import Completion, Park, Parked, Resume
from gpuactors.engine.runtime import EngineConfig
from gpuactors.errors import DeviceFault, InvalidArgument, TaskHung, TaskTimeout
from test_engine_on_host import BrokenStream, fill, loop_turns_until, start

pytestmark = pytest.mark.usefixtures("cupy_like_arrays")


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("engine-review-s34") as actor_system:
        yield actor_system


class Relaunching(HostRuntime):
    """A kick relaunches the kernel (it runs until parked); the kernel takes the tasks
    only when the test says so."""

    def kick(self) -> bool:
        super().kick()
        if not self.hold:
            self.running = True
        return False


async def test_a_task_whose_deadline_passed_in_a_park_is_not_a_hang(
    system: ActorSystem,
) -> None:
    """A Park holds a task past its deadline and the hang grace; at the Resume the
    relaunched kernel skips it (TaskTimeout). The poller's hang check had counted the
    park as running time, declared the engine hung before the kernel reached the task
    and faulted it."""
    runtime = Relaunching(auto=False)
    ref, engine = await start(system, runtime, config=EngineConfig(hang_grace_ms=200.0))
    await ref.ask(Park())
    task = asyncio.ensure_future(ref.ask(fill(timeout=0.01)))
    await asyncio.sleep(0.3)  # its deadline and the grace pass while the kernel is parked
    await ref.ask(Resume())
    assert runtime.running
    await asyncio.sleep(0.02)  # poller rounds while the kernel has not reached it yet
    runtime.finish(lambda seq, record: abi.STATUS_DEADLINE)  # the device's deadline check
    with pytest.raises(TaskTimeout, match="missed its deadline"):
        await asyncio.wait_for(task, 2)
    assert engine._service.faulted is None
    runtime.auto = True
    assert isinstance(await ref.ask(fill(), timeout=2), Completion)


async def test_a_task_still_running_its_grace_after_a_relaunch_is_a_hang(
    system: ActorSystem,
) -> None:
    """The grace counts from the relaunch, and a hang is still found after it."""
    runtime = Relaunching(auto=False)
    ref, engine = await start(system, runtime, config=EngineConfig(hang_grace_ms=50.0))
    await ref.ask(Park())
    task = asyncio.ensure_future(ref.ask(fill(timeout=0.01)))
    await asyncio.sleep(0.1)
    await ref.ask(Resume())
    runtime.consumer.take()  # the kernel takes it, and never finishes it
    with pytest.raises(TaskHung):
        await asyncio.wait_for(task, 5)
    assert engine._service.faulted is not None


async def test_a_park_name_taken_again_is_not_ended_by_the_earlier_park(
    system: ActorSystem,
) -> None:
    """A named Park waits for a long task; its Resume ends it and a new Park takes the
    name. The first Park's asker then leaves: that ends nothing (its Park had ended),
    and the second Park answers with the kernel held. (Keyed by its name, the first
    Park's wait had ended the second's hold.)"""
    runtime = HostRuntime()
    runtime.running = True  # a long task: the kernel parks only once it ends
    runtime.parks_on_request = False
    ref, engine = await start(system, runtime)
    first = asyncio.ensure_future(ref.ask(Park(hold=7)))
    await asyncio.sleep(0.02)
    await ref.ask(Resume(hold=7))  # ends the first Park: the name is free again
    second = asyncio.ensure_future(ref.ask(Park(hold=7), timeout=5))
    await asyncio.sleep(0.02)
    first.cancel()  # its asker leaves
    await asyncio.sleep(0.02)
    runtime.running = False  # the long task ended and the kernel parked
    assert isinstance(await second, Parked)
    assert runtime.hold and len(engine._parks) == 1  # the second Park holds the kernel
    task = asyncio.ensure_future(ref.ask(fill()))
    await asyncio.sleep(0.02)
    assert not task.done()  # accepted, held
    await ref.ask(Resume(hold=7))
    assert not runtime.hold and len(engine._parks) == 0
    assert isinstance(await asyncio.wait_for(task, 2), Completion)


@pytest.mark.parametrize("op", [["fill"], {"fill"}])
async def test_an_unhashable_op_name_is_invalid_argument_and_loses_nothing(
    system: ActorSystem, op: Any
) -> None:
    """``Engine.enqueue`` of an op name that is no str (a list) is refused as ``Enqueue``
    refuses it. A lone one had failed the Submit handler with a TypeError, and the
    restart that followed failed every task in flight."""
    runtime = HostRuntime(auto=False)
    ref, engine = await start(system, runtime)
    client = Engine(ref)
    out = CupyLikeArray("float32", 64)
    with pytest.raises(InvalidArgument, match="op must be a str"):  # an idle engine: in line
        await asyncio.wait_for(client.enqueue(op, out, 1.0, n=8, after="none"), 2)
    other = asyncio.ensure_future(ref.ask(fill()))
    await loop_turns_until(lambda: runtime.ring.published == 1)
    with pytest.raises(InvalidArgument, match="op must be a str"):  # a busy one
        await asyncio.wait_for(client.enqueue(op, out, 1.0, n=8, after="none"), 2)
    runtime.finish()
    assert isinstance(await asyncio.wait_for(other, 2), Completion)
    assert ref._cell.instance is engine and engine._service.faulted is None


async def test_an_enqueue_whose_stream_cannot_be_read_is_the_askers_error(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Enqueue`` as ``Engine.enqueue`` and ``EnqueueBatch``: the query of the caller's
    stream failing with anything is the asker's InvalidArgument, and the engine goes on
    (it had failed the handler: the actor restarted, failing every task in flight)."""
    runtime = HostRuntime(auto=False)
    ref, engine = await start(system, runtime)
    other = asyncio.ensure_future(ref.ask(fill()))
    await loop_turns_until(lambda: runtime.ring.published == 1)
    monkeypatch.setattr(streams_module, "current_stream", lambda _device_id: BrokenStream())
    monkeypatch.setattr(streams_module, "device_context", lambda _device_id: nullcontext())
    with pytest.raises(InvalidArgument, match="could not be read"):
        await ref.ask(fill(after="current_stream"), timeout=2)
    runtime.finish()
    assert isinstance(await asyncio.wait_for(other, 2), Completion)
    assert ref._cell.instance is engine and engine._service.faulted is None


class _FaultsWhileParked(Actor):
    """An engine whose kernel faulted while parked: its Resume fails."""

    @handles(Park)
    def park(self, _msg: Park) -> Parked:
        return Parked(launches=0)

    @handles(Resume)
    def resume(self, _msg: Resume) -> None:
        raise DeviceFault("the engine faulted while parked")


async def test_a_parked_blocks_own_error_is_not_replaced_by_its_resumes(
    system: ActorSystem,
) -> None:
    engine = Engine(system.spawn(Props(_FaultsWhileParked)))
    with pytest.raises(ValueError, match="the block's own"):
        async with engine.parked():
            raise ValueError("the block's own")
    with pytest.raises(DeviceFault):  # (a block that ended well hears of the Resume's)
        async with engine.parked():
            pass
