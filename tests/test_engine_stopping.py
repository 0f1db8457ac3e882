"""The engine actor stopping, restarting or faulting, on the host ring (no GPU): what a
shutdown, a restart, a cancelled caller or a fault leaves behind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from gpuactors.actors import ActorRef, ActorSystem, Props, handles
from gpuactors.engine import actor as actor_module
from gpuactors.engine import live_ops as live_ops_module
from gpuactors.engine.client import Engine
from gpuactors.engine.host_runtime import HostEngine, HostRuntime, NoModules
from gpuactors.engine.messages import (
    Completion,
    InstallOp,
    Park,
    Parked,
    Resume,
    Shutdown,
    Stats,
)
from gpuactors.engine.ops import OpSpec
from gpuactors.errors import ActorStopped, DeviceFault, EngineStopped
from gpuactors.messages import Message
from test_engine_on_host import NEGATE, fill


class Fail(Message):
    """Makes the engine's handler raise: a bug, as supervision sees one."""


class FailingEngine(HostEngine):
    """The host engine with one handler that fails (so that supervision restarts it)."""

    @handles(Fail)
    def fail(self, _msg: Fail) -> None:
        raise RuntimeError("a handler's bug")


pytestmark = pytest.mark.usefixtures("cupy_like_arrays")


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("engine-stopping") as actor_system:
        yield actor_system


async def start(
    system: ActorSystem, runtime: HostRuntime, engine: type[HostEngine] = HostEngine, **kwargs: Any
) -> tuple[ActorRef, HostEngine]:
    ref = system.spawn(Props(engine, args=(runtime,), kwargs=kwargs), "engine")
    await asyncio.sleep(0.01)  # (pre_start)
    instance = ref._cell.instance
    assert isinstance(instance, HostEngine)
    return ref, instance


async def turns(count: int = 100) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_restart_during_a_shutdown_leaves_the_fresh_engine_serving(
    system: ActorSystem,
) -> None:
    """A Shutdown waits for a task; the actor fails meanwhile and is restarted. The old
    instance's shutdown ends with it (its asker is told): it must not stop the fresh
    instance, which serves."""
    runtime = HostRuntime(auto=False)
    ref, old = await start(system, runtime, FailingEngine)
    task = asyncio.ensure_future(ref.ask(fill()))
    await turns()
    shutdown = asyncio.ensure_future(ref.ask(Shutdown()))
    await turns()
    assert not shutdown.done()
    ref.tell(Fail())
    with pytest.raises(EngineStopped):
        await asyncio.wait_for(task, 5)
    with pytest.raises(ActorStopped, match="restarted"):
        await asyncio.wait_for(shutdown, 5)
    await turns()
    fresh = ref._cell.instance
    assert fresh is not old
    runtime.auto = True
    runtime.hold = False
    done = await asyncio.wait_for(ref.ask(fill()), 5)
    assert isinstance(done, Completion)
    assert (await ref.ask(Stats(), timeout=5)).processed == 1


async def test_a_park_waiting_when_the_engine_stops_fails_with_engine_stopped(
    system: ActorSystem,
) -> None:
    """A Park waits for a long task; the engine stops, and closing its runtime parks
    the kernel. The Park's asker is told the engine stopped (not an AssertionError)."""

    class Parking(HostRuntime):
        def close(self) -> None:  # (the real runtime's close parks the kernel for good)
            self.running = False

    runtime = Parking()
    runtime.running = True  # a long task: the kernel parks only once it ends
    runtime.parks_on_request = False
    ref, _engine = await start(system, runtime)
    park = asyncio.ensure_future(ref.ask(Park()))
    await turns()
    assert not park.done()
    await asyncio.wait_for(system.stop(ref), 5)
    with pytest.raises(EngineStopped):
        await asyncio.wait_for(park, 5)


async def test_a_park_whose_caller_left_never_ends_a_later_parks_hold(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``parked()`` block is cancelled while its Park waits for a long task; its
    Park's wait then times out. A second Park, asked meanwhile, still holds the kernel
    once it has parked: each Park's hold ends once (a Park whose caller left, once)."""
    timeouts = iter([0.2, 5.0])  # the first Park's wait, then the second's

    async def wait_until(condition: Callable[[], bool], what: str) -> None:
        await live_ops_module.wait_until(condition, what, next(timeouts))

    monkeypatch.setattr(actor_module, "wait_until", wait_until)
    runtime = HostRuntime()
    runtime.running = True  # a long task: the kernel parks only once it ends
    runtime.parks_on_request = False
    ref, engine = await start(system, runtime)
    holder = asyncio.ensure_future(hold_parked(Engine(ref)))
    await turns()
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    later = asyncio.ensure_future(ref.ask(Park(), timeout=5))
    await asyncio.sleep(0.4)  # the first Park's wait (0.2 s) is over by now
    runtime.running = False  # the long task ended: the kernel parks
    assert isinstance(await later, Parked)
    assert runtime.hold and len(engine._parks) == 1  # the second Park holds
    await ref.ask(Resume())
    assert not runtime.hold


class AnswersAsItsCallerIsCancelled(HostRuntime):
    """Cancels ``caller`` as the Park answers: the engine reads ``launches`` for the
    reply, and the cancel lands after the reply is set, before the caller sees it."""

    caller: asyncio.Task[None] | None = None

    @property
    def launches(self) -> int:
        if self.caller is not None:
            asyncio.get_running_loop().call_soon(self.caller.cancel)
        return self._launches

    @launches.setter
    def launches(self, value: int) -> None:
        self._launches = value


async def test_a_parked_block_cancelled_as_its_park_answers_leaves_the_kernel_free(
    system: ActorSystem,
) -> None:
    """The Park answered, but its caller was cancelled before it saw the reply: the
    block's Resume (named) still ends that Park, and the kernel is free."""
    runtime = AnswersAsItsCallerIsCancelled()
    runtime.running = True  # a long task: the kernel parks only once it ends
    runtime.parks_on_request = False
    ref, engine = await start(system, runtime)
    runtime.caller = holder = asyncio.ensure_future(hold_parked(Engine(ref)))
    await turns()
    runtime.running = False  # the long task ended: the Park answers
    with pytest.raises(asyncio.CancelledError):
        await holder
    await turns()
    assert not runtime.hold and len(engine._parks) == 0
    assert isinstance(await ref.ask(fill(), timeout=2), Completion)


async def hold_parked(engine: Engine) -> None:
    async with engine.parked():
        await asyncio.sleep(10)


class ParksAtATaskBoundary(HostRuntime):
    """Closes as the real runtime does: the kernel finishes the tasks it took, then
    parks for good; the tasks it did not take stay unrun."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.running_tasks: list[int] = []

    def take(self, count: int) -> None:
        """The kernel takes ``count`` tasks and runs them (they finish when it parks)."""
        self.running_tasks += [seq for seq, _record in self.consumer.take(limit=count)]

    def close(self) -> None:
        for seq in self.running_tasks:
            self.consumer.complete(seq, 0)
        self.running = False


async def test_tasks_the_kernel_finished_while_the_engine_stopped_get_their_replies(
    system: ActorSystem,
) -> None:
    """An engine stopped with tasks in flight parks its kernel at a task boundary: the
    tasks the kernel had taken finish first. Their callers get their Completions (they
    ran, their outputs are written); only the tasks never run fail with EngineStopped."""
    runtime = ParksAtATaskBoundary(auto=False)
    ref, _engine = await start(system, runtime)
    replies = [asyncio.ensure_future(ref.ask(fill())) for _ in range(3)]
    await turns()
    runtime.take(2)
    await asyncio.wait_for(system.stop(ref), 5)
    results = await asyncio.gather(*replies, return_exceptions=True)
    assert [type(result) for result in results] == [Completion, Completion, EngineStopped]


def faulted_kernel(runtime: HostRuntime) -> None:
    """The kernel faults: it never exits (so never parks), and the stream says so."""
    runtime.running = True
    runtime.parks_on_request = False

    def fault() -> None:
        raise DeviceFault("an illegal address")

    runtime.check_fault = fault  # type: ignore[method-assign]


async def test_a_forced_shutdown_of_a_faulted_engine_does_not_wait_for_a_park(
    system: ActorSystem,
) -> None:
    """A faulted kernel never parks (it is abandoned): a forced shutdown, the usual
    response to a fault, reports at once instead of timing out waiting for a park."""
    runtime = HostRuntime(auto=False)
    ref, engine = await start(system, runtime)
    task = asyncio.ensure_future(ref.ask(fill()))
    await turns()
    faulted_kernel(runtime)
    with pytest.raises(DeviceFault):
        await asyncio.wait_for(task, 5)
    assert engine._service.faulted is not None
    report = await ref.ask(Shutdown(force=True), timeout=2)
    assert (report.completed, report.cancelled) == (0, 0)
    await asyncio.wait_for(system.watch(ref), 5)


async def test_a_park_waiting_when_the_engine_faults_fails_with_the_fault(
    system: ActorSystem,
) -> None:
    """A Park waits for the kernel to park; the kernel faults instead (and never
    parks): the Park fails with the fault at once, not with a timeout later."""
    runtime = HostRuntime(auto=False)
    runtime.running = True  # a long task: the kernel parks only once it ends
    runtime.parks_on_request = False
    ref, _engine = await start(system, runtime)
    task = asyncio.ensure_future(ref.ask(fill()))
    park = asyncio.ensure_future(ref.ask(Park(), timeout=2))
    await turns()
    faulted_kernel(runtime)
    with pytest.raises(DeviceFault):
        await asyncio.wait_for(task, 5)
    with pytest.raises(DeviceFault):
        await park


async def test_an_install_waiting_for_a_park_when_the_engine_faults_fails_with_the_fault(
    system: ActorSystem,
) -> None:
    """An install waits for the kernel to park before its module swap; the kernel
    faults instead (and never parks): the install fails with the fault at once, and
    the engine stops without waiting for it."""
    runtime = HostRuntime(auto=False)
    runtime.running = True  # a long task: the kernel parks only once it ends
    runtime.parks_on_request = False
    ref, engine = await start(system, runtime)
    task = asyncio.ensure_future(ref.ask(fill()))
    install = asyncio.ensure_future(ref.ask(InstallOp(op=NEGATE), timeout=2))
    await turns()
    assert engine._live_ops.swapping
    faulted_kernel(runtime)
    with pytest.raises(DeviceFault):
        await asyncio.wait_for(task, 5)
    with pytest.raises(DeviceFault):
        await install
    await asyncio.wait_for(system.stop(ref), 2)


class SlowModules(NoModules):
    """Live operators whose compile takes ``COMPILE_SECONDS``, as NVRTC's does on a GPU host."""

    compiles = 0

    async def engine_image(self, ops: Sequence[OpSpec], ids: dict[str, int]) -> bytes:
        SlowModules.compiles += 1
        await asyncio.sleep(COMPILE_SECONDS)
        return b""


class SlowCompileEngine(HostEngine):
    _live_ops_class = SlowModules


COMPILE_SECONDS = 0.4


async def test_a_stop_compiles_none_of_the_installs_queued_behind_it(
    system: ActorSystem,
) -> None:
    """The install compiling when the stop comes may end its compile (it is refused
    after it); those queued behind it are refused without one, so the stop waits for
    one compile at most."""
    ref = system.spawn(Props(SlowCompileEngine, args=(HostRuntime(),)), "engine")
    await turns()
    SlowModules.compiles = 0
    installs = [
        asyncio.ensure_future(
            ref.ask(InstallOp(op=OpSpec(name=f"op{index}", body="return 0;")), timeout=30)
        )
        for index in range(4)
    ]
    await asyncio.sleep(0.05)  # the first install compiles, three wait for their turn
    started = time.monotonic()
    await system.stop(ref, timeout=30)
    stopped_after = time.monotonic() - started
    for install in installs:
        with pytest.raises(EngineStopped):
            await install
    assert SlowModules.compiles == 1
    assert stopped_after < 1.5 * COMPILE_SECONDS
