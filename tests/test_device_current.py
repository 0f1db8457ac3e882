"""Every CUDA call an engine makes runs with its own device current (CPU tests).

The rule (docs/architecture.md, "One device's fault stays on its device"): a call made
while another device is current is made in that device's context and answers its
sticky error, so one device's fault would fail another device's tasks. What is checked
here is the host logic that enforces it, over a stand-in for CuPy's runtime that
records which device is current at each call (and answers like a faulted context
where the current device faulted). Whether CUDA itself behaves so is for the GPU test
(tests/test_group_gpu.py, the in-process fault on either device).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpuactors.cuda import status as cuda_status
from gpuactors.cuda.current import on_device
from gpuactors.cuda.generation import GenerationRegistry
from gpuactors.cuda.loader import ModuleLoadGate
from gpuactors.engine import streams
from gpuactors.engine.runtime import EngineConfig, EngineRuntime
from gpuactors.errors import DeviceFault, EngineError, GpuRefStale

ILLEGAL_ADDRESS = 700


class CUDARuntimeError(RuntimeError):
    def __init__(self, status: int) -> None:
        super().__init__(f"CUDA error {status}")
        self.status = status


class Runtime:
    """CuPy's ``cuda.runtime`` as these tests need it: one current device per thread
    (one thread here), devices whose context faulted, streams and what each call saw."""

    CUDARuntimeError = CUDARuntimeError

    def __init__(self, current: int = 0, faulted: frozenset[int] = frozenset()) -> None:
        self.current = current
        self.faulted = set(faulted)
        self.set_calls: list[int] = []
        self.stream_device: dict[int, int] = {}  # stream pointer -> its device
        self.queried_on: list[int] = []  # the device current at each stream query

    def getDevice(self) -> int:
        return self.current

    def setDevice(self, device: int) -> None:
        self.set_calls.append(device)
        if device in self.faulted:  # (as cudaSetDevice may, into a poisoned context)
            raise CUDARuntimeError(ILLEGAL_ADDRESS)
        self.current = device

    def streamQuery(self, ptr: int) -> int:
        """A query answers the current context's sticky error, else its stream's state."""
        self.queried_on.append(self.current)
        if self.current in self.faulted or self.stream_device[ptr] in self.faulted:
            return ILLEGAL_ADDRESS
        return cuda_status.SUCCESS


# ------------------------------------------------------------------- on_device
def test_a_block_runs_on_its_device_and_the_callers_device_comes_back() -> None:
    runtime = Runtime(current=0)
    with on_device(1, runtime):
        assert runtime.current == 1
        with on_device(2, runtime):
            assert runtime.current == 2
        assert runtime.current == 1
    assert runtime.current == 0
    assert runtime.set_calls == [1, 2, 1, 0]


def test_a_block_on_the_current_device_sets_nothing() -> None:
    runtime = Runtime(current=1)
    with on_device(1, runtime):
        assert runtime.current == 1
    assert runtime.set_calls == []


def test_an_error_in_the_block_still_gives_the_device_back() -> None:
    runtime = Runtime(current=0)
    with pytest.raises(ValueError, match="in the block"), on_device(1, runtime):
        raise ValueError("in the block")
    assert runtime.current == 0


def test_a_faulted_callers_device_is_not_this_blocks_error() -> None:
    """Device 0 faulted and is current: a block for device 1 runs, and giving device 0
    back fails with device 0's sticky error. That is not device 1's failure: nothing
    is raised, and device 1 stays current."""
    runtime = Runtime(current=0, faulted=frozenset({0}))
    with on_device(1, runtime):
        pass
    assert runtime.current == 1 and runtime.set_calls == [1, 0]


def test_a_non_sticky_error_giving_the_device_back_is_raised() -> None:
    """Only another device's fault is let pass: any other error (an invalid device,
    say) is a bug of ours, raised."""
    runtime = Runtime(current=0)
    set_device = runtime.setDevice

    def set_device_then_fail(device: int) -> None:
        if runtime.set_calls:  # the restore
            raise CUDARuntimeError(101)  # cudaErrorInvalidDevice
        set_device(device)

    runtime.setDevice = set_device_then_fail  # type: ignore[method-assign]
    with pytest.raises(CUDARuntimeError), on_device(1, runtime):
        pass


# ------------------------------------------------------------------ the engine
def runtime_for(device_id: int, cupy_runtime: Runtime, stream_ptr: int) -> EngineRuntime:
    """An EngineRuntime's host state without a GPU: only what ``check_fault`` and
    ``_launch`` read (its constructor allocates on the device)."""
    engine = EngineRuntime.__new__(EngineRuntime)
    engine.device_id = device_id
    engine.config = EngineConfig()
    engine.launch_error = None
    engine.launches = 0
    engine.grid = 2
    engine.control = np.zeros(8, dtype=np.uint64)
    engine.stream = SimpleNamespace(ptr=stream_ptr)
    engine._params = SimpleNamespace(data=SimpleNamespace(ptr=0))
    engine._cupy = SimpleNamespace(cuda=SimpleNamespace(runtime=cupy_runtime))
    cupy_runtime.stream_device[stream_ptr] = device_id
    return engine


def test_an_engines_fault_check_asks_its_own_context_only() -> None:
    """Device 0 faulted and is current (the caller's device): device 1's engine asks
    its stream with device 1 current and finds nothing wrong; device 0's finds its fault."""
    cupy_runtime = Runtime(current=0, faulted=frozenset({0}))
    device0 = runtime_for(0, cupy_runtime, stream_ptr=0x100)
    device1 = runtime_for(1, cupy_runtime, stream_ptr=0x200)
    with pytest.raises(DeviceFault, match="cudaErrorIllegalAddress"):
        device0.check_fault()
    device1.check_fault()
    assert cupy_runtime.queried_on == [0, 1]
    # Device 1 stays current (device 0 cannot be made current again): device 0's
    # engine, asking again, still finds its own fault, typed.
    with pytest.raises(DeviceFault, match="device 0"):
        device0.check_fault()
    device1.check_fault()


def test_an_engines_launch_runs_with_its_device_current() -> None:
    cupy_runtime = Runtime(current=0)
    engine = runtime_for(1, cupy_runtime, stream_ptr=0x200)
    launched_on: list[int] = []
    engine._kernel = lambda *args, **kwargs: launched_on.append(cupy_runtime.current)
    engine._launch()
    assert launched_on == [1] and engine.launches == 1 and cupy_runtime.current == 0


# ---------------------------------------------------- the caller's stream's event
class Stream:
    """The caller's CuPy stream of one device: busy, and what device each call saw."""

    def __init__(self, cupy_runtime: Runtime) -> None:
        self.runtime = cupy_runtime
        self.asked_on: list[int] = []

    @property
    def done(self) -> bool:
        self.asked_on.append(self.runtime.current)
        return False

    def record(self) -> Any:
        self.asked_on.append(self.runtime.current)
        stream = self

        class Event:
            @property
            def done(self) -> bool:
                stream.asked_on.append(stream.runtime.current)
                return True

        return Event()


def test_the_callers_stream_and_its_event_are_asked_on_their_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cupy_runtime = Runtime(current=0)

    def context(device_id: int) -> AbstractContextManager[Any]:
        return on_device(device_id, cupy_runtime)

    monkeypatch.setattr(streams, "device_context", context)
    stream = Stream(cupy_runtime)
    event = streams.stream_event(stream, 1)
    assert event is not None and cupy_runtime.current == 0
    assert event.done  # asked later, by the poller, while device 0 is current
    assert stream.asked_on == [1, 1, 1] and cupy_runtime.current == 0


# ------------------------------------------------------- per-device fault state
def test_a_devices_generation_moves_alone() -> None:
    registry = GenerationRegistry()
    before = {d: registry.current(d) for d in (0, 1)}
    registry.bump(0)
    assert registry.current(0) == before[0] + 1 and registry.current(1) == before[1]
    registry.check_current("device 1's engine", 1, before[1])  # still serving
    with pytest.raises(GpuRefStale):
        registry.check_current("device 0's engine", 0, before[0])


class Engine:
    """A registered engine as the module-load gate sees it."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.parks = 0

    def park_blocking(self, timeout: float) -> None:
        self.parks += 1
        if self.error is not None:
            raise self.error


def test_a_faulted_engine_does_not_fail_another_devices_module_load() -> None:
    """Before a load every engine is parked; one whose device faulted (its park finds
    the fault) runs no kernel: the load for another device goes on."""
    gate = ModuleLoadGate()
    faulted, healthy = Engine(DeviceFault("device 0 faulted")), Engine()
    gate.register(faulted)
    gate.register(healthy)
    gate.park_all(1.0)
    assert faulted.parks == 1 and healthy.parks == 1


def test_a_hung_engine_still_stops_a_module_load() -> None:
    gate = ModuleLoadGate()
    hung = Engine(EngineError("engine did not park within 1.0 s"))
    gate.register(hung)
    with pytest.raises(EngineError):
        gate.park_all(1.0)


def test_a_faulted_device_made_current_is_a_device_fault() -> None:
    runtime = Runtime(current=1, faulted=frozenset({0}))
    with pytest.raises(DeviceFault, match="device 0"), on_device(0, runtime):
        pass
    assert runtime.current == 1
