"""The GPU side of an engine: memory, the kernel instance, parking and relaunch.

This layer is synchronous and knows nothing about asyncio or actors; the
engine actor drives it. It owns:

* the ring, completion markers and control block in pinned host memory,
* the engine state in device memory (survives relaunches and module swaps),
* the loaded engine module and its kernel,
* the kernel's lifecycle: launch on demand, park on request, swap modules
  while parked (the ring and every accepted task stay where they are).
"""

from __future__ import annotations

import enum
import platform
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import Field, field_validator

from gpuactors.checked import Settings
from gpuactors.cuda import status as cuda_status
from gpuactors.cuda.current import on_device
from gpuactors.cuda.loader import MODULE_LOADS, ModuleLoadGate
from gpuactors.engine.abi import (
    COMPLETION,
    DEVICE_STATE,
    ENGINE_PARAMS,
    HOST_CONTROL,
    RING_RECORD,
    TASK_RECORD,
    UNIT_BYTES,
)
from gpuactors.engine.codegen import CLOCK_KERNEL_NAME, ENGINE_KERNEL_NAME
from gpuactors.engine.expansion import EXPAND_MIN_TASKS
from gpuactors.engine.messages import MAX_TIMEOUT_S
from gpuactors.engine.ops import OpSpec
from gpuactors.engine.ring import HostRing, check_capacity, reset_ring, u64_words
from gpuactors.errors import DeviceFault, EngineError, EngineModeError, InvalidArgument
from gpuactors.logs import get_logger

_log = get_logger(component="engine-runtime")

# Word indexes into the HostControl block.
_PARK_REQUEST, _PARKED_EPOCH, _LAUNCHED_EPOCH, _CONSUMED, _HEARTBEAT, _EXIT_REASON = range(6)

# Resources of engines whose kernel faulted or hung: never freed (see EngineRuntime.abandon).
_ABANDONED: list[tuple[Any, ...]] = []


class PersistentThreadMode(str, enum.Enum):
    """How the engine runs its kernel.

    AUTO: persistent when the whole grid can be resident at once, else one
    launch per batch. FORCE: persistent or :class:`EngineModeError`. DISABLE:
    one ordinary launch per batch of ready tasks, same ops, same results.
    """

    AUTO = "auto"
    FORCE = "force"
    DISABLE = "disable"


#: The longest duration a setting takes, in ms: a task's own timeout is capped there too.
_MAX_MS = MAX_TIMEOUT_S * 1e3
#: CUDA's limit on a grid's x dimension.
_MAX_GRID_BLOCKS = (1 << 31) - 1
#: How old the clock offset may get before it is measured again (by the next deadline
#: converted while no kernel runs, or by the next relaunch). The device's clock and the
#: host's drift apart by microseconds a second (5.4 us/s on an H200), so a deadline
#: converted with an old offset would expire early by that much per second of the
#: engine's life; a measurement holds the event loop for about 0.2 ms.
CLOCK_RECALIBRATE_SECONDS = 5.0


class EngineConfig(Settings):
    """Sizes and timings of one engine. Defaults suit many small tasks.

    Checked when built (a strict pydantic model: see :mod:`gpuactors.checked`):
    durations are finite and at most ``MAX_TIMEOUT_S`` (about 11.6 days), counts are
    ints, and a bad value raises InvalidArgument naming the field.
    """

    capacity: int = 4096
    # Blocks of the engine kernel; None: one per SM. Block 0 dispatches, so at least 2.
    grid_blocks: Annotated[int, Field(ge=2, le=_MAX_GRID_BLOCKS)] | None = None
    block_threads: Literal[64, 128, 256, 512, 1024] = 256
    idle_park_ms: float = Field(default=2.0, ge=0, le=_MAX_MS)
    max_residency_ms: float = Field(default=100.0, ge=0, le=_MAX_MS)  # 0: never park for it
    max_units_per_task: int = Field(default=128, ge=1, le=65536)
    # A lone one-block task with n up to this runs on the dispatcher's block, with no
    # hand-off to a worker (the latency path); polling waits for it. 0: never.
    inline_max_n: int = Field(default=1 << 12, ge=0, lt=1 << 64)
    # Enum members or their values ("auto", ...): the one field that converts.
    mode: PersistentThreadMode = Field(default=PersistentThreadMode.AUTO, strict=False)
    # A task this late past its deadline hangs the engine.
    hang_grace_ms: float = Field(default=1000.0, gt=0, le=_MAX_MS)
    # Deadline of tasks sent without one: every wait ends (None: tasks may wait forever).
    default_task_timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)] | None = 60.0
    # An EnqueueBatch of at least this many one-block tasks is a ring record per 65,536
    # tasks that the kernel expands (gpuactors.engine.expansion); None: every batch goes
    # record by record.
    expand_batches_from: Annotated[int, Field(ge=1)] | None = EXPAND_MIN_TASKS

    @field_validator("capacity")
    @classmethod
    def _check_capacity(cls, capacity: int) -> int:
        return check_capacity(capacity)

    @property
    def unit_capacity(self) -> int:
        """Unit queue entries: room for a full warp's worth of maximal tasks, power of two."""
        need = max(self.capacity, 32 * self.max_units_per_task)
        return 1 << (need - 1).bit_length()


def check_start_options(
    ops: Sequence[object], config: object, *, device_id: object, full_policy: object
) -> EngineConfig:
    """The config an engine starts with (``EngineConfig()`` for None), once the rest of
    its start options are checked too: a misspelt ``full_policy`` would act as "wait",
    and a wrong type would fail later with an AttributeError far from its cause."""
    if not all(isinstance(op, OpSpec) for op in ops):
        raise InvalidArgument(f"ops must be OpSpecs, got {[type(op).__name__ for op in ops]}")
    if config is not None and not isinstance(config, EngineConfig):
        raise InvalidArgument(f"config must be an EngineConfig or None, not {config!r}")
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
        raise InvalidArgument(f"device_id must be an int >= 0, not {device_id!r}")
    if full_policy not in ("wait", "fail"):
        raise InvalidArgument(f"full_policy must be 'wait' or 'fail', not {full_policy!r}")
    return config or EngineConfig()


@contextmanager
def _cuda_errors_as_faults(doing: str) -> Iterator[None]:
    """A CUDA error while ``doing`` as DeviceFault (the device's, not the caller's);
    MemoryError (CuPy's out-of-memory error is one) passes as it is."""
    try:
        yield
    except MemoryError:
        raise
    except Exception as exc:
        raise DeviceFault(f"{doing} failed: {type(exc).__name__}: {exc}") from exc


class DeviceBytes:
    """Bytes of device memory, copied to and from on a stream of their own (the
    kernel's stream never drains while the engine runs)."""

    def __init__(
        self, memory: Any, stream: Any, current: Callable[[], AbstractContextManager[None]]
    ) -> None:
        self._memory = memory  # a CuPy uint8 array: its pool frees it with this object
        self._stream = stream
        self._current = current
        self.ptr = int(memory.data.ptr)

    def copy_in(self, offset: int, host: np.ndarray) -> None:
        with self._current(), _cuda_errors_as_faults("copying a batch's descriptor"):
            bytes_ = host.view(np.uint8).reshape(-1)
            self._memory[offset : offset + bytes_.nbytes].set(bytes_, stream=self._stream)

    def wait(self) -> None:
        with self._current(), _cuda_errors_as_faults("copying a batch's descriptor"):
            self._stream.synchronize()

    def read(self, offset: int, count: int, dtype: np.dtype[Any]) -> np.ndarray:
        with self._current(), _cuda_errors_as_faults("reading a batch's statuses"):
            raw: np.ndarray = self._memory[offset : offset + count * dtype.itemsize].get(
                stream=self._stream
            )
            self._stream.synchronize()
        return raw.view(dtype)


def _pinned(cupy: Any, dtype: np.dtype[Any], count: int) -> tuple[Any, np.ndarray]:
    memory = cupy.cuda.alloc_pinned_memory(dtype.itemsize * count)
    return memory, np.frombuffer(memory, dtype=dtype, count=count)


class EngineRuntime:
    """One engine's GPU resources and kernel lifecycle (not thread-safe: one owner)."""

    def __init__(
        self,
        image: bytes,
        config: EngineConfig,
        *,
        gate: ModuleLoadGate = MODULE_LOADS,
        device_id: int = 0,
    ) -> None:
        import cupy

        if platform.machine().lower() not in ("x86_64", "amd64"):
            raise EngineModeError(
                "the engine's host side relies on x86-64 store and load ordering (TSO) for "
                f"the ring protocol; {platform.machine()} is not supported yet"
            )
        self._cupy = cupy
        self.config = config
        self._gate = gate
        self.device_id = device_id
        with self._current():
            props = cupy.cuda.runtime.getDeviceProperties(device_id)
            self.sm_count = int(props["multiProcessorCount"])
            self.grid = config.grid_blocks or self.sm_count
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self._copy_stream: Any = None  # expanded batches' copies (made on first use)

            cap = config.capacity
            self._ring_mem, records = _pinned(cupy, RING_RECORD, cap)
            self._done_mem, completions = _pinned(cupy, COMPLETION, cap)
            self._ctrl_mem, control = _pinned(cupy, HOST_CONTROL, 1)
            reset_ring(records, completions)
            control[...] = np.zeros((), dtype=HOST_CONTROL)
            self.ring = HostRing(records, completions)
            self.control = control.view(np.uint64)
            self._control_words = u64_words(control)  # (``running`` is read on every kick)

            ucap = config.unit_capacity
            self._state = cupy.zeros(DEVICE_STATE.itemsize, dtype=cupy.uint8)
            self._tasks = cupy.zeros(cap * TASK_RECORD.itemsize, dtype=cupy.uint8)
            self._units_left = cupy.zeros(cap, dtype=cupy.uint32)
            self._task_status = cupy.zeros(cap, dtype=cupy.int32)
            self._t_start = cupy.zeros(cap, dtype=cupy.uint64)
            self._units = cupy.zeros(ucap * UNIT_BYTES, dtype=cupy.uint8)
            self._params_host = np.zeros(1, dtype=ENGINE_PARAMS)
            self._params = cupy.zeros(ENGINE_PARAMS.itemsize, dtype=cupy.uint8)

            self._clock_mem, self._clock_word = _pinned(cupy, np.dtype(np.uint64), 1)
            #: device clock minus host clock (``time.time_ns``), at most: see calibrate_clock
            self.clock_offset_ns = 0
            self.clock_measured_at = 0.0  # when (time.monotonic)
            #: told each new offset (the engine's service converts deadlines with it)
            self.on_clock_offset: Callable[[int], None] | None = None
            self._module: Any = None
            self._kernel: Any = None
            self._clock_kernel: Any = None
            self.launches = 0
            self.hold = False  # while True, kick() never relaunches (parked on demand)
            #: Held by kick from its look at the gate until its launch is counted.
            self._launching = threading.Lock()
            self.launch_error: Exception | None = None
            self.mode_persistent = True
            self._install(image)
            self.mode_persistent = self._resolve_mode()
            self._write_params()
            cupy.cuda.runtime.deviceSynchronize()
            self.calibrate_clock()
        gate.register(self)

    def _current(self) -> AbstractContextManager[None]:
        """This engine's device made current for a block: every CUDA call the engine
        makes runs in its own context (see :mod:`gpuactors.cuda.current`)."""
        return on_device(self.device_id, self._cupy.cuda.runtime)

    # ------------------------------------------------------------ setup
    def _install(self, image: bytes) -> None:
        """Load an engine module (through the gate, which parks us first), in this
        engine's device context: a module loaded while another device is current
        belongs to that device, and launching its kernel here fails."""
        with self._current():
            module = self._gate.load(image)
            self._kernel = module.get_function(ENGINE_KERNEL_NAME)
            self._clock_kernel = module.get_function(CLOCK_KERNEL_NAME)
        self._module = module  # the old module is released once unreferenced (we are parked)

    def _resolve_mode(self) -> bool:
        mode = self.config.mode
        if mode is PersistentThreadMode.DISABLE:
            return False
        resident = self._resident_blocks()
        if resident >= self.grid:
            return True
        message = (
            f"a persistent engine needs all {self.grid} blocks resident at once, "
            f"the device fits {resident} of {self.config.block_threads} threads"
        )
        if mode is PersistentThreadMode.FORCE:
            raise EngineModeError(message)
        _log.warning("persistent mode unavailable, launching per batch", reason=message)
        return False

    def _resident_blocks(self) -> int:
        driver = self._cupy.cuda.driver
        with self._current():
            per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(
                self._kernel.ptr, self.config.block_threads, 0
            )
        return int(per_sm) * self.sm_count

    def _write_params(self) -> None:
        p = self._params_host
        p["ring"] = self._ring_mem.ptr
        p["completions"] = self._done_mem.ptr
        p["control"] = self._ctrl_mem.ptr
        p["state"] = self._state.data.ptr
        p["tasks"] = self._tasks.data.ptr
        p["units_left"] = self._units_left.data.ptr
        p["task_status"] = self._task_status.data.ptr
        p["t_start"] = self._t_start.data.ptr
        p["units"] = self._units.data.ptr
        p["capacity"] = self.config.capacity
        p["unit_capacity"] = self.config.unit_capacity
        p["idle_ns"] = int(self.config.idle_park_ms * 1e6)
        p["max_residency_ns"] = int(self.config.max_residency_ms * 1e6)
        p["max_units_per_task"] = self.config.max_units_per_task
        p["persistent"] = 1 if self.mode_persistent else 0
        p["inline_max_n"] = self.config.inline_max_n
        self._params.set(p.view(np.uint8))

    # ------------------------------------------------------------ lifecycle
    @property
    def running(self) -> bool:
        """A kernel instance was launched and has not announced its exit yet."""
        return self.launches != self._control_words[_PARKED_EPOCH]

    @property
    def consumed(self) -> int:
        """Ring positions the device has taken (valid while parked)."""
        return self._control_words[_CONSUMED]

    @property
    def exit_reason(self) -> int:
        return int(self.control[_EXIT_REASON])

    def pending_unconsumed(self) -> bool:
        return self.ring.published > self.consumed

    def kick(self) -> bool:
        """Launch a kernel instance if work waits and none runs. True if it launched.

        The look at the gate and the launch are one step to a module load: it parks
        the engines (:meth:`park_blocking`, in its thread) only once a launch under way
        is counted in ``running``. Else a load that began between them saw no kernel
        running, did not park it, and waited behind it (for good under steady traffic
        with ``max_residency_ms=0``)."""
        if self.hold or self.running or not self.pending_unconsumed():
            return False
        with self._launching:  # (uncontended but for a load's park: one per launch)
            if self._gate.loading:
                return False
            self.measure_clock_if_old()  # (no kernel runs now: the clock kernel can)
            try:
                self._launch()
            except Exception as exc:  # a poisoned context: report through check_fault
                self.launch_error = exc
                self.hold = True
                return False
        return True

    def _launch(self) -> None:
        self.control[_PARK_REQUEST] = 0
        with self._current():
            self._kernel(
                (self.grid,),
                (self.config.block_threads,),
                (np.uint64(self._params.data.ptr),),
                stream=self.stream,
            )
        self.launches += 1

    def check_fault(self) -> None:
        """Raise DeviceFault if a launch failed or the engine's stream reports an error."""
        if self.launch_error is not None:
            raise DeviceFault(f"launching the engine kernel failed: {self.launch_error}")
        runtime = self._cupy.cuda.runtime
        # Not Stream.done: it reports a faulted stream as merely "not done". In this
        # engine's context: another device's, if current, would answer its own fault.
        with self._current():
            status = int(runtime.streamQuery(self.stream.ptr))
        if status not in (cuda_status.SUCCESS, cuda_status.NOT_READY):
            raise DeviceFault(
                f"the engine kernel failed: CUDA error {status} ({cuda_status.error_name(status)})"
            )

    def request_park(self) -> None:
        """Ask a running kernel to exit at the next task boundary (does not wait)."""
        if self.running:
            self.control[_PARK_REQUEST] = 1

    def park_blocking(self, timeout: float = 10.0) -> None:
        """Ask the kernel to stop at a task boundary and wait until it has exited."""
        with self._launching:  # a kick's launch under way is counted first (see kick)
            if not self.running:
                return
        self.control[_PARK_REQUEST] = 1
        deadline = time.monotonic() + timeout
        try:
            next_check = time.monotonic() + 0.005
            while self.running:
                now = time.monotonic()
                if now > next_check:  # a dead kernel never parks: fail fast on a fault
                    self.check_fault()
                    next_check = now + 0.005
                if now > deadline:
                    raise EngineError(f"engine did not park within {timeout} s")
                time.sleep(0)
        finally:
            self.control[_PARK_REQUEST] = 0

    def calibrate_clock(self, rounds: int = 8) -> int:
        """Measure ``clock_offset_ns``: the device's clock (``%globaltimer``, which task
        deadlines are compared with) minus the host's (``time.time_ns``). They are not
        aligned: offsets of -5 ms to +0.2 ms were seen on the GPU machines. A one-thread
        kernel reads the device clock between two host reads; the tightest of ``rounds``
        brackets gives the offset's upper bound, so a deadline converted with it never
        expires early (at most the bracket's width, microseconds, late). Only while no
        engine kernel runs (a launch would queue behind it): at start, then as
        :meth:`measure_clock_if_old` says."""
        best: tuple[int, int] | None = None  # (bracket width, offset's upper bound)
        word, out = self._clock_word, (np.uint64(self._clock_mem.ptr),)
        with self._current():
            for _ in range(rounds):
                word[0] = 0
                before = time.time_ns()
                self._clock_kernel((1,), (1,), out, stream=self.stream)
                give_up = time.monotonic() + 5.0
                while word[0] == 0:
                    if time.monotonic() > give_up:
                        raise EngineError("the device clock did not answer within 5 s")
                after = time.time_ns()
                width, offset = after - before, int(word[0]) - before
                if best is None or width < best[0]:
                    best = (width, offset)
            self.stream.synchronize()
        assert best is not None
        self._clock_measured(best[1])
        return best[1]

    def measure_clock_if_old(self) -> None:
        """Measure the clock offset again if it is ``CLOCK_RECALIBRATE_SECONDS`` old and
        no kernel runs (a running one would hold the clock kernel back: the next
        relaunch measures it) nor a module loads. Where the measurement fails, the old
        offset stays for another period (logged): a poisoned context is the poller's
        fault check's to report, not a deadline's."""
        if (
            time.monotonic() - self.clock_measured_at <= CLOCK_RECALIBRATE_SECONDS
            or self.running
            or self._gate.loading
        ):
            return
        try:
            self.calibrate_clock()
        except Exception as exc:
            _log.warning("the device clock was not measured again", error=str(exc))
            self._clock_measured(self.clock_offset_ns)

    def _clock_measured(self, offset_ns: int) -> None:
        """``offset_ns`` is the clock offset for the next period; tell the service."""
        self.clock_offset_ns = offset_ns
        self.clock_measured_at = time.monotonic()
        if self.on_clock_offset is not None:
            self.on_clock_offset(offset_ns)

    def swap_module(self, image: bytes) -> None:
        """Hand the ring over to a new engine module (parks, loads; the next kick
        relaunches).

        A persistent engine needs its whole grid resident at once; a module whose ops
        need more registers or shared memory than that allows is refused, and the
        running module stays (EngineModeError), instead of deadlocking at launch.
        """
        self.park_blocking()
        previous = (self._module, self._kernel, self._clock_kernel)
        self._install(image)
        if self.mode_persistent and self._resident_blocks() < self.grid:
            self._module, self._kernel, self._clock_kernel = previous
            raise EngineModeError(
                f"the new engine module cannot keep all {self.grid} blocks resident "
                "(its ops need too many registers or too much shared memory); "
                "the running module stays"
            )

    def allocate(self, nbytes: int) -> DeviceBytes:
        """Device memory on this engine's device (an expanded batch's descriptor).
        MemoryError when the device has none to spare; DeviceFault for a CUDA error."""
        with self._current(), _cuda_errors_as_faults("allocating a batch's descriptor"):
            if self._copy_stream is None:  # (not the kernel's: that one never drains)
                self._copy_stream = self._cupy.cuda.Stream(non_blocking=True)
            return DeviceBytes(
                self._cupy.empty(nbytes, dtype=self._cupy.uint8), self._copy_stream, self._current
            )

    def abandon(self, keepalive: Sequence[Any] = ()) -> None:
        """Give up on a faulted or hung kernel without waiting for it.

        Parking, synchronising or unloading the module would block on a kernel that
        may never return, and anything it can still touch must stay valid: this
        runtime (module, ring, device state, stream) and the callers' buffers in
        ``keepalive`` are kept referenced for the life of the process (a deliberate,
        bounded leak), and the gate forgets this engine.
        """
        self._gate.unregister(self)
        self.hold = True
        _ABANDONED.append((self, tuple(keepalive)))

    def close(self, timeout: float = 10.0) -> None:
        """Park for good and release the module. Pending tasks stay unrun."""
        self._gate.unregister(self)
        self.park_blocking(timeout)  # raises if the kernel will not park: then abandon()
        with self._current():  # (a worker thread's current device is its own)
            self.stream.synchronize()
        self._kernel = None
        self._module = None
