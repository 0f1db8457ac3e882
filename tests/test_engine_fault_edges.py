"""The engine's faults at the edges, on the host ring (no GPU): a fault or a hang found
by the stop's park, a forced shutdown waiting for a park when the engine faults, the
tasks a batch ran before a fault, a stop or a hang cut it short (counted in
``EngineStats``), and a module load racing an engine's launch (the gate's logic, with
no CUDA)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
import threading
import time
import types
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorSystem
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.cuda.loader import ModuleLoadGate
from gpuactors.engine.abi import BATCH_OP, STATUS_BATCH_FAILED
from gpuactors.engine.host_runtime import HostBytes, HostRuntime
from gpuactors.engine.messages import Completion, EngineStats, Shutdown, Stats
from gpuactors.engine.ring import u64_words
from gpuactors.engine.runtime import _PARK_REQUEST, _PARKED_EPOCH, EngineConfig, EngineRuntime
from gpuactors.errors import DeviceFault, EngineError, EngineStopped, TaskHung
from test_engine_on_host import fill, loop_turns_until, offsets_batch, start
from test_engine_review_s34 import Relaunching
from test_engine_stopping import faulted_kernel

pytestmark = pytest.mark.usefixtures("cupy_like_arrays")


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("engine-fault-edges") as actor_system:
        yield actor_system


async def turns(count: int = 100) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def stats_of(ref: Any) -> tuple[int, int]:
    stats: EngineStats = await ref.ask(Stats(), timeout=5)
    return stats.processed, stats.failed


def finish_batch_part(runtime: HostRuntime, count: int) -> None:
    """The kernel takes ``count`` published records and finishes them, the first failed."""
    for index, (seq, _record) in enumerate(runtime.consumer.take(limit=count)):
        runtime.consumer.complete(seq, 3 if index == 0 else 0)


# ------------------------------------------------------------ found by the stop's park
class FaultsAsItParks(HostRuntime):
    """The kernel faults before the stop's park: ``close`` finds it (as
    ``EngineRuntime.park_blocking``'s ``check_fault`` does)."""

    def close(self) -> None:
        raise DeviceFault("the engine kernel failed: CUDA error 700 (cudaErrorIllegalAddress)")


async def test_a_fault_found_by_the_stops_park_is_declared(system: ActorSystem) -> None:
    """The device's generation moves (handles made in the poisoned context are
    refused), the task the kernel held gets the DeviceFault, not EngineStopped, and
    its buffers stay referenced (the faulted kernel may still touch them)."""
    runtime = FaultsAsItParks(auto=False)
    ref, engine = await start(system, runtime)
    generation = GENERATIONS.current(engine._service.device_id)
    task = asyncio.ensure_future(ref.ask(fill()))
    await loop_turns_until(lambda: runtime.ring.published == 1)
    await asyncio.wait_for(system.stop(ref), 5)
    with pytest.raises(DeviceFault, match="cudaErrorIllegalAddress"):
        await asyncio.wait_for(task, 5)
    assert GENERATIONS.current(engine._service.device_id) == generation + 1
    assert len(runtime.abandoned) == 1  # the task, and its buffers with it


class HangsAsItParks(HostRuntime):
    """While the stop's park waits, the kernel finishes its first task; its second
    never returns, so it does not park (``park_blocking``'s EngineError) within the
    park's 10 ms here."""

    def close(self) -> None:
        (seq, _record), _running = self.consumer.take(limit=2)
        self.consumer.complete(seq)
        time.sleep(0.01)
        raise EngineError("engine did not park within 0.01 s")


async def test_a_kernel_that_does_not_park_as_the_engine_stops_is_hung(
    system: ActorSystem,
) -> None:
    """As a hang the poller finds (the task is past its deadline and grace): the task
    that never returns gets TaskHung, the rest the DeviceFault, and the generation
    moves; the task the kernel finished meanwhile gets its reply."""
    runtime = HangsAsItParks(auto=False)
    ref, engine = await start(system, runtime, config=EngineConfig(hang_grace_ms=1.0))
    generation = GENERATIONS.current(engine._service.device_id)
    finished, hung, never_taken = (
        asyncio.ensure_future(ref.ask(fill(timeout=0.001))) for _ in range(3)
    )
    await loop_turns_until(lambda: runtime.ring.published == 3)
    await asyncio.wait_for(system.stop(ref), 5)
    assert isinstance(await asyncio.wait_for(finished, 5), Completion)
    with pytest.raises(TaskHung, match="task 2 of op 'fill' is still running"):
        await asyncio.wait_for(hung, 5)
    with pytest.raises(DeviceFault, match="did not park"):
        await asyncio.wait_for(never_taken, 5)
    assert GENERATIONS.current(engine._service.device_id) == generation + 1


async def test_a_kernel_still_running_a_task_within_its_time_is_slow_not_hung(
    system: ActorSystem,
) -> None:
    """A long task (its deadline not passed) keeps the kernel from parking as the
    engine stops: it is abandoned with its buffers, the callers get EngineStopped, and
    the device stays trusted (no new generation: its handles stay good)."""
    runtime = HangsAsItParks(auto=False)
    ref, engine = await start(system, runtime)
    generation = GENERATIONS.current(engine._service.device_id)
    finished, slow = (asyncio.ensure_future(ref.ask(fill())) for _ in range(2))
    await loop_turns_until(lambda: runtime.ring.published == 2)
    await asyncio.wait_for(system.stop(ref), 5)
    assert isinstance(await asyncio.wait_for(finished, 5), Completion)
    with pytest.raises(EngineStopped):
        await asyncio.wait_for(slow, 5)
    assert GENERATIONS.current(engine._service.device_id) == generation
    assert len(runtime.abandoned) == 1  # the slow task, and its buffers with it


# ------------------------------------------------------ a forced shutdown's park wait
async def test_a_forced_shutdown_waiting_for_a_park_fails_with_the_fault(
    system: ActorSystem,
) -> None:
    """ "A fault ends any wait for a park (a forced shutdown's...): those asks get the
    DeviceFault". It had reported success, as though the kernel had parked."""
    runtime = HostRuntime(auto=False)
    runtime.running = True  # a long task: the kernel parks only once it ends
    runtime.parks_on_request = False
    ref, engine = await start(system, runtime)
    task = asyncio.ensure_future(ref.ask(fill()))
    stopping = asyncio.ensure_future(ref.ask(Shutdown(force=True), timeout=5))
    await turns()
    assert not stopping.done()  # waiting for the park
    faulted_kernel(runtime)
    with pytest.raises(DeviceFault):
        await asyncio.wait_for(task, 5)
    assert engine._service.faulted is not None
    with pytest.raises(DeviceFault, match="an illegal address"):
        await stopping


# -------------------------------------------------- what a batch cut short had run
async def test_a_fault_counts_what_a_batch_it_cut_short_ran(system: ActorSystem) -> None:
    """Each task a batch ran counts as processed (or failed), as a forced shutdown
    counts them; the fault had forgotten them."""
    runtime = HostRuntime(auto=False)
    ref, engine = await start(system, runtime, config=EngineConfig(expand_batches_from=None))
    reply = asyncio.ensure_future(ref.ask(offsets_batch(10)))
    await loop_turns_until(lambda: runtime.ring.published == 10)
    finish_batch_part(runtime, 4)
    await loop_turns_until(lambda: engine._completions.batches[0].finished == 4)
    faulted_kernel(runtime)
    with pytest.raises(DeviceFault):
        await asyncio.wait_for(reply, 5)
    assert await stats_of(ref) == (3, 1)


async def test_a_faults_reason_names_the_batches_in_flight(system: ActorSystem) -> None:
    """Their tasks from their first seq, an expanded batch's too (not its ring record);
    the reason had named single tasks only."""
    runtime = HostRuntime(auto=False)
    ref, _engine = await start(system, runtime)
    small = asyncio.ensure_future(ref.ask(offsets_batch(10)))
    await loop_turns_until(lambda: runtime.ring.published == 10)
    expanded = asyncio.ensure_future(ref.ask(offsets_batch(1000)))  # one ring record
    await loop_turns_until(lambda: runtime.ring.published == 11)
    faulted_kernel(runtime)
    for reply in (small, expanded):
        with pytest.raises(
            DeviceFault, match=r"batches \[10 tasks from seq 1, 1000 tasks from seq 11\]"
        ):
            await asyncio.wait_for(reply, 5)


async def test_a_hang_counts_what_the_hung_batch_ran(system: ActorSystem) -> None:
    """The batch's fifth task never returns: it counts as failed (the TaskTimeout it
    is), and the four before it as they ended."""
    runtime = Relaunching(auto=False)
    ref, engine = await start(
        system, runtime, config=EngineConfig(expand_batches_from=None, hang_grace_ms=50.0)
    )
    reply = asyncio.ensure_future(ref.ask(offsets_batch(10, timeout=0.01)))
    await loop_turns_until(lambda: runtime.ring.published == 10)
    finish_batch_part(runtime, 4)
    runtime.consumer.take(limit=1)  # the kernel takes the fifth and never finishes it
    with pytest.raises(TaskHung, match="task 5 of op 'fill'"):
        await asyncio.wait_for(reply, 5)
    assert engine._service.faulted is not None
    assert await stats_of(ref) == (3, 2)


async def test_a_stop_counts_what_a_batch_it_cut_short_ran(system: ActorSystem) -> None:
    runtime = HostRuntime(auto=False)
    ref, engine = await start(system, runtime, config=EngineConfig(expand_batches_from=None))
    reply = asyncio.ensure_future(ref.ask(offsets_batch(10)))
    await loop_turns_until(lambda: runtime.ring.published == 10)
    finish_batch_part(runtime, 4)
    await asyncio.wait_for(system.stop(ref), 5)
    with pytest.raises(EngineStopped):
        await asyncio.wait_for(reply, 5)
    completions = engine._completions
    assert (completions.processed, completions.failed) == (3, 1)


class UnreadableBytes(HostBytes):
    def read(self, offset: int, count: int, dtype: np.dtype[Any]) -> np.ndarray:
        raise DeviceFault("reading a batch's statuses failed: cudaErrorIllegalAddress")


class UnreadableStatuses(HostRuntime):
    """Device memory that cannot be read back, as after a fault."""

    def allocate(self, nbytes: int) -> HostBytes:
        buffer = UnreadableBytes(nbytes)
        self.buffers[buffer.ptr] = buffer
        return buffer


async def test_a_fault_counts_nothing_of_a_batch_whose_statuses_it_cannot_read(
    system: ActorSystem,
) -> None:
    """An expanded batch ends with a task failed; reading which faults (the poller's
    harvest declares it). That batch counts nothing, and the count goes on to the
    batch behind it: the four tasks it ran."""
    runtime = UnreadableStatuses(auto=False)
    ref, engine = await start(system, runtime)
    expanded = asyncio.ensure_future(ref.ask(offsets_batch(1000)))  # one ring record
    await loop_turns_until(lambda: runtime.ring.published == 1)
    cut_short = asyncio.ensure_future(ref.ask(offsets_batch(10)))
    await loop_turns_until(lambda: runtime.ring.published == 11)
    (seq, record), *behind = runtime.consumer.take(limit=11)
    assert int(record["op"]) == BATCH_OP
    for index, (task_seq, _record) in enumerate(behind[:4]):
        runtime.consumer.complete(task_seq, 3 if index == 0 else 0)
    await loop_turns_until(lambda: engine._completions.batches[1].finished == 4)
    runtime.consumer.complete(seq, STATUS_BATCH_FAILED)
    for reply in (expanded, cut_short):
        with pytest.raises(DeviceFault):
            await asyncio.wait_for(reply, 5)
    assert engine._service.faulted is not None
    assert await stats_of(ref) == (3, 1)


# ------------------------------------------------- a module load racing a launch
def runtime_on_host(gate: ModuleLoadGate) -> EngineRuntime:
    """An EngineRuntime's host state without a GPU (its constructor allocates on the
    device): what ``kick`` and ``park_blocking`` read. A task waits; no kernel runs."""
    runtime = EngineRuntime.__new__(EngineRuntime)
    runtime.config = EngineConfig()
    runtime.grid = 2
    runtime.hold = False
    runtime.launches = 0
    runtime.launch_error = None
    runtime._launching = threading.Lock()
    runtime._gate = gate
    runtime.control = np.zeros(8, dtype=np.uint64)
    runtime._control_words = u64_words(runtime.control)
    runtime.ring = SimpleNamespace(published=1)  # type: ignore[assignment]
    runtime.clock_measured_at = math.inf  # (measured just now: no clock kernel)
    runtime.stream = SimpleNamespace(ptr=0)
    runtime._params = SimpleNamespace(data=SimpleNamespace(ptr=0))
    runtime._current = contextlib.nullcontext  # type: ignore[method-assign]
    stream_ok = SimpleNamespace(streamQuery=lambda _ptr: 0)  # (cudaSuccess)
    runtime._cupy = SimpleNamespace(cuda=SimpleNamespace(runtime=stream_ok))
    gate.register(runtime)
    return runtime


def test_a_module_load_parks_a_kernel_whose_launch_it_raced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A load begins (another thread) while the loop's kick launches: after kick looked
    at the gate, before the launch is counted. Its park must still see the kernel and
    park it before the load: a load behind a resident kernel waits until the kernel
    exits, and with ``max_residency_ms=0`` under steady traffic it never does. (The
    load had seen no kernel running and gone ahead.)"""
    device = SimpleNamespace(resident=False)  # is a kernel instance on the device?
    loads: list[bool] = []  # for each module load: was a kernel resident then?
    loaded = threading.Event()

    class Module:
        def load(self, _image: bytes) -> None:
            loads.append(device.resident)
            loaded.set()

    function = types.ModuleType("cupy.cuda.function")
    function.Module = Module  # type: ignore[attr-defined]
    cuda = types.ModuleType("cupy.cuda")
    cuda.function = function  # type: ignore[attr-defined]
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda  # type: ignore[attr-defined]
    for name, module in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.function", function)):
        monkeypatch.setitem(sys.modules, name, module)

    gate = ModuleLoadGate()
    runtime = runtime_on_host(gate)
    errors: list[BaseException] = []

    def load() -> None:
        try:
            gate.load(b"module")
        except BaseException as exc:
            errors.append(exc)

    loader = threading.Thread(target=load)

    def launch(*_args: Any, **_kwargs: Any) -> None:
        device.resident = True
        loader.start()  # the load begins while the launch call runs
        loaded.wait(0.3)  # (a load that does not wait for this launch is done by then)

    runtime._kernel = launch
    assert runtime.kick()
    give_up = time.monotonic() + 5
    while loader.is_alive() and time.monotonic() < give_up:  # the device: it parks if asked
        if runtime.control[_PARK_REQUEST]:
            device.resident = False
            runtime.control[_PARKED_EPOCH] = runtime.launches
        time.sleep(0.001)
    loader.join(5)
    assert not errors
    assert loads == [False]
