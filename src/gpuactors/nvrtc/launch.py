"""Kernel launches for NvrtcActor: argument marshalling, CUDA error mapping and
completion waiting.

Arguments become what ``cuLaunchKernel`` gets: a device array its pointer (an
8-byte value), a NumPy scalar its bytes, written into the actor's
:class:`~gpuactors.nvrtc.params.ParamBuffer`; every check happens before the
launch. The launch itself is one ``cuLaunchKernel`` through CuPy's driver binding
(CuPy's kernel launcher would convert the arguments a second time).

Completion: a launch made while no other is in flight is first spun on for a few
microseconds where it was made, and answered at once if it finished: an untimed
one through a :class:`~gpuactors.cuda.done_word.DoneWord` its stream writes behind
it, a timed one through its end event (timed launches record events before and
after the kernel). Every other launch, and a lone one still running after its
spin, gets an event after the kernel and goes to one :class:`CompletionPoller`
task per actor, which queries the
events (oldest first per stream: work on one stream completes in order) and
resolves the launches' futures: it spins in short bounded bursts, yielding to
the loop between them, and after a couple of milliseconds backs off to sleeps.
No thread per launch, and the loop is never held for more than one burst.

This module imports CuPy only when an array argument or a launch needs it.
"""

from __future__ import annotations

import asyncio
import re
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from gpuactors.cuda import polling
from gpuactors.cuda import status as cuda_status
from gpuactors.cuda.arrays import check_device, cupy_c_contiguous, cupy_ndarray, describe_array
from gpuactors.cuda.done_word import DoneWord
from gpuactors.cuda.scalars import struct_code
from gpuactors.errors import (
    ActorStopped,
    DeviceFault,
    InvalidArgument,
    LaunchError,
)
from gpuactors.nvrtc.handle import Params
from gpuactors.nvrtc.messages import Dims, Launched
from gpuactors.nvrtc.params import SLOT_BYTES, ParamBuffer

#: NumPy scalar types a launch passes by value.
_SCALAR_CHARS = frozenset("?bhilqBHILQefdFD")
_POINTER_BYTES = 8
_POINTER = struct.Struct("<Q")
_EMPTY_SLOT = bytes(SLOT_BYTES)

_STICKY_TEXT = re.compile(
    r"ILLEGAL_ADDRESS|IllegalAddress|MISALIGNED|Misaligned|LAUNCH_FAILED|LaunchFailure|"
    r"ILLEGAL_INSTRUCTION|IllegalInstruction|HARDWARE_STACK|HardwareStack|INVALID_PC|InvalidPc|"
    r"ERROR_ASSERT|cudaErrorAssert|ECC_UNCORRECTABLE|ECCUncorrectable|LAUNCH_TIMEOUT|LaunchTimeout"
)

_EVENT_POOL_SIZE = 64
_REPLY_CACHE_SIZE = 1024

_modules: dict[str, ModuleType] = {}


def cupy_module() -> Any:
    """CuPy, imported on first use."""
    module = _modules.get("cupy")
    if module is None:
        import cupy

        module = _modules["cupy"] = cupy
    return module


# ------------------------------------------------------------------ arguments
def _scalar_packer(char: str) -> tuple[struct.Struct | None, int, bool]:
    """How a NumPy scalar type is stored: a struct of its C type (None for complex,
    stored by its bytes), its size, and whether a NaN must be stored by its bytes too
    (float16 and float32 go through a Python float in struct, which changes NaN
    payloads)."""
    dtype = np.dtype(char)
    code = struct_code(dtype)
    packer = None if code is None else struct.Struct("<" + code)
    return packer, dtype.itemsize, dtype.kind == "f" and dtype.itemsize < 8


_SCALAR_PACKERS = {np.dtype(char).type: _scalar_packer(char) for char in _SCALAR_CHARS}


def check_arity(args: Sequence[Any], params: Params, name: str) -> None:
    """InvalidArgument unless ``args`` has one value per kernel parameter (if known)."""
    if params is not None and len(args) != len(params):
        raise InvalidArgument(
            f"kernel {name!r} takes {len(params)} arguments, got {len(args)} "
            f"(parameter sizes in bytes: {list(params)})"
        )


def pack_args(
    args: Sequence[Any], params: Params, device_id: int, name: str, buffer: ParamBuffer
) -> None:
    """Write the launch values of ``args`` for kernel ``name`` into ``buffer``, or raise
    InvalidArgument saying which one is wrong and why. CuPy arrays and NumPy scalars
    that fit take a fast path: a few checks and one struct store each."""
    ndarray = cupy_ndarray()
    buffer.reserve(len(args))
    data = buffer.data
    offset = 0
    for index, value in enumerate(args):
        size = None if params is None else params[index]
        kind = type(value)
        if kind is ndarray:
            memory = value.data
            pointer = memory.ptr
            if (
                (size is None or size == _POINTER_BYTES)
                and memory.device_id == device_id
                and not pointer % value.dtype.itemsize  # (else the general path says so)
                and cupy_c_contiguous(value)
            ):
                _POINTER.pack_into(data, offset, pointer)
                offset += SLOT_BYTES
                continue
        else:
            scalar = _SCALAR_PACKERS.get(kind)
            if scalar is not None and (size is None or scalar[1] == size):
                packer, itemsize, nan_by_bytes = scalar
                if params is None:  # the kernel's own size is unknown: no stale bytes
                    data[offset : offset + SLOT_BYTES] = _EMPTY_SLOT
                if packer is None or (nan_by_bytes and value != value):
                    data[offset : offset + itemsize] = value.tobytes()
                else:
                    packer.pack_into(data, offset, value)
                offset += SLOT_BYTES
                continue
        raw = _checked(value, size, device_id, f"argument {index} of kernel {name!r}")
        data[offset : offset + SLOT_BYTES] = raw.ljust(SLOT_BYTES, b"\0")
        offset += SLOT_BYTES


def _checked(value: Any, size: int | None, device_id: int, where: str) -> bytes:
    """The launch bytes of one argument, by the general path that says what is wrong."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if isinstance(value, np.generic):
        return _scalar(value, size, where).tobytes()
    if isinstance(value, bool | int | float | complex):
        raise InvalidArgument(
            f"{where} is a Python {type(value).__name__} ({value!r}): pass a typed NumPy "
            "scalar (np.int32, np.int64, np.float32, np.float64...) matching the kernel's "
            "parameter"
        )
    if size is not None and size != _POINTER_BYTES:
        raise InvalidArgument(
            f"{where} is a device array (passed as an 8-byte pointer) but the kernel's "
            f"parameter is {size} bytes"
        )
    return np.uint64(_pointer(value, device_id, where)).tobytes()


def _scalar(value: np.generic, size: int | None, where: str) -> np.generic:
    dtype = value.dtype
    if dtype.char not in _SCALAR_CHARS:
        raise InvalidArgument(
            f"{where}: a NumPy {dtype} scalar cannot be passed to a kernel; use a bool, "
            "integer, float or complex NumPy scalar"
        )
    if size is not None and dtype.itemsize != size:
        raise InvalidArgument(
            f"{where} is {dtype} ({dtype.itemsize} bytes) but the kernel's parameter is "
            f"{size} bytes"
        )
    return value


def _pointer(value: Any, device_id: int, where: str) -> int:
    info = describe_array(value, where)
    check_device(info, device_id, where)
    if not info.contiguous:
        raise InvalidArgument(
            f"{where} is not C-contiguous: the kernel gets a pointer to its first element; "
            "pass a contiguous copy (cupy.ascontiguousarray) or the pointer itself as np.uint64"
        )
    return int(info.ptr)


# --------------------------------------------------------------------- launch
def launch_kernel(
    function: int, grid: Dims, block: Dims, shared_mem: int, stream: int, params: ParamBuffer
) -> None:
    """``cuLaunchKernel`` of a loaded function (its ``CUfunction`` as an int) on
    ``stream`` (a stream pointer; 0 is CuPy's legacy default stream) with the values in
    ``params``; the device must be current. Through CuPy's driver binding, which takes
    plain ints (cuda-bindings wants handle objects, about 0.5 us more per launch);
    a failure raises CuPy's ``CUDADriverError`` with the ``CUresult`` as ``status``.

    Stream 0 is passed as ``CU_STREAM_LEGACY``: that stream whatever the process's
    per-thread default stream setting."""
    cupy_module().cuda.driver.launchKernel(
        function,
        *grid,
        *block,
        shared_mem,
        stream or cuda_status.CU_STREAM_LEGACY,
        params.address,
        0,
    )


# --------------------------------------------------------------------- errors
def cuda_error(exc: BaseException, what: str) -> LaunchError | DeviceFault:
    """A CUDA failure as gpuactors sees it: DeviceFault when it poisons the context."""
    if isinstance(exc, LaunchError | DeviceFault):
        return exc
    status = getattr(exc, "status", None)
    sticky = status in cuda_status.STICKY if isinstance(status, int) else False
    if sticky or _STICKY_TEXT.search(str(exc)):
        error: LaunchError | DeviceFault = DeviceFault(
            f"{what}: {exc} (the device's context is poisoned: rebuild it)"
        )
    else:
        error = LaunchError(f"{what}: {exc}")
    error.__cause__ = exc
    return error


# ----------------------------------------------------------------- completion
class PendingLaunch:
    """A launch in flight: its reply future, its events (``start`` only when timed),
    and what must outlive it."""

    __slots__ = ("end", "future", "keepalive", "name", "start", "stream_key", "symbol")

    def __init__(
        self,
        future: asyncio.Future[Launched],
        events: tuple[Any | None, Any],
        name: str,
        symbol: str,
        stream_key: int,
        keepalive: tuple[Any, ...],
    ) -> None:
        self.future = future
        self.start, self.end = events
        self.name = name
        self.symbol = symbol
        self.stream_key = stream_key
        self.keepalive = keepalive

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class EventPool:
    """Reusable CUDA events (creating events costs more than reusing): timing pairs
    for timed launches, single events without timing (cheaper to record) otherwise."""

    def __init__(self) -> None:
        self._timed: list[tuple[Any, Any]] = []
        self._plain: list[Any] = []

    def take(self, timed: bool) -> tuple[Any | None, Any]:
        """``(start, end)`` for the current device (call with the actor's device
        current); ``start`` is None for an untimed launch."""
        if timed:
            if self._timed:
                return self._timed.pop()
            event = cupy_module().cuda.Event
            return event(), event()
        if self._plain:
            return None, self._plain.pop()
        return None, cupy_module().cuda.Event(disable_timing=True)

    def give(self, start: Any | None, end: Any) -> None:
        if start is None:
            if len(self._plain) < _EVENT_POOL_SIZE:
                self._plain.append(end)
        elif len(self._timed) < _EVENT_POOL_SIZE:
            self._timed.append((start, end))

    def clear(self) -> None:
        self._timed.clear()
        self._plain.clear()


def _finished(status: int, start: Any | None, end: Any) -> float | None:
    """A launch whose query no longer says NOT_READY: its GPU time in ms when it was
    timed (``start`` recorded), else None; raises the CUDA error it ended with."""
    cuda = cupy_module().cuda
    if status != 0:
        raise cuda.runtime.CUDARuntimeError(status)
    return None if start is None else float(cuda.get_elapsed_time(start, end))


#: Launches whose actor stopped before they completed: kept here so their buffers
#: stay alive until the GPU is done with them (pruned at every poller close).
_ORPHANS: list[PendingLaunch] = []


def event_status(event: Any) -> int:
    """``cudaEventQuery`` of a CuPy event: 0 done, 600 not ready, else the CUDA error.

    (CuPy's ``Event.done`` is False for an error too: a faulted launch would look
    forever unfinished.)
    """
    return int(cupy_module().cuda.runtime.eventQuery(event.ptr))


def _prune_orphans() -> None:
    kept = []
    for launch in _ORPHANS:
        try:
            running = event_status(launch.end) == cuda_status.NOT_READY
        except Exception:  # nothing will run any more
            running = False
        if running:
            kept.append(launch)
    _ORPHANS[:] = kept


class CompletionPoller:
    """Resolves the futures of one actor's launches as their end events complete."""

    def __init__(self, on_fault: Callable[[DeviceFault], None]) -> None:
        self._queues: dict[int, deque[PendingLaunch]] = {}
        self._on_fault = on_fault
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._drained: asyncio.Future[None] | None = None  # set while close() waits
        self.in_flight = 0
        self.completed = 0
        #: Set by a device fault; the actor refuses launches until its generation moves.
        self.fault: DeviceFault | None = None
        self.events = EventPool()
        self._replies: dict[tuple[str, str], Launched] = {}

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="launch-poller")

    def spin_alone(
        self,
        stream: Any,
        events: tuple[Any | None, Any] | None,
        name: str,
        symbol: str,
        done_word: DoneWord | None = None,
    ) -> Launched | None:
        """A launch made while no other was in flight: spin on it briefly right here.

        An untimed launch has no event yet: ``stream`` holds nothing queued after it,
        so the stream's own state is the launch's. With a usable ``done_word`` the
        launch queues the word's write behind the kernel and spins on the word (a
        memory read per check instead of a stream query). Its reply if it finished,
        None if it still runs (then :meth:`add` it); its error if it failed (a device
        fault also fails the actor's launches to come).
        """
        try:
            if events is None and done_word is not None and done_word.usable:
                token = done_word.arm(stream.ptr)
                if token is not None:
                    if not done_word.wait(token, polling.SPIN_SECONDS):
                        return None  # still running, or faulted: the event path says which
                    self.completed += 1
                    return self._reply(name, symbol, None)
            runtime = cupy_module().cuda.runtime
            if events is None:
                query, target = runtime.streamQuery, stream.ptr
            else:
                query, target = runtime.eventQuery, events[1].ptr
            until = time.perf_counter() + polling.SPIN_SECONDS
            while (status := query(target)) == cuda_status.NOT_READY:
                if time.perf_counter() >= until:
                    return None
            elapsed_ms = _finished(status, *(events or (None, None)))
        except Exception as exc:
            error = cuda_error(exc, f"kernel {name!r}")
            if isinstance(error, DeviceFault):
                self.fail_all(error)
            raise error from exc
        self.completed += 1
        if events is not None:
            self.events.give(*events)
        return self._reply(name, symbol, elapsed_ms)

    def add(self, launch: PendingLaunch) -> None:
        """Track a launch just made; the poller task answers it."""
        queue = self._queues.get(launch.stream_key)
        if queue is None:
            queue = self._queues[launch.stream_key] = deque()
        queue.append(launch)
        self.in_flight += 1
        if self._wake is not None:
            self._wake.set()

    def spin(self, until: float) -> None:
        """Check for completions until one arrives or ``until`` (perf_counter) passes."""
        while time.perf_counter() < until:
            if self.harvest():
                return

    def harvest(self) -> int:
        """Resolve every launch that has completed; returns how many were settled."""
        settled = 0
        if not self._queues:
            return 0
        query = cupy_module().cuda.runtime.eventQuery
        for key in list(self._queues):
            queue = self._queues[key]
            while queue:
                launch = queue[0]
                try:
                    status = query(launch.end.ptr)
                    if status == cuda_status.NOT_READY:
                        break
                    elapsed_ms = _finished(status, launch.start, launch.end)
                except Exception as exc:
                    error = cuda_error(exc, f"kernel {launch.name!r}")
                    if isinstance(error, DeviceFault):
                        return settled + self.fail_all(error)
                    queue.popleft()
                    self.in_flight -= 1
                    launch.fail(error)
                    settled += 1
                    continue
                queue.popleft()
                self.in_flight -= 1
                self.completed += 1
                settled += 1
                self.events.give(launch.start, launch.end)
                if not launch.future.done():
                    launch.future.set_result(self._reply(launch.name, launch.symbol, elapsed_ms))
            if not queue:
                del self._queues[key]
        return settled

    def _reply(self, name: str, symbol: str, elapsed_ms: float | None) -> Launched:
        """A launch's reply; untimed replies are immutable, so one per kernel is shared."""
        # (validating is cheaper than model_construct)
        if elapsed_ms is not None:
            return Launched(name=name, symbol=symbol, elapsed_us=elapsed_ms * 1e3)
        key = (name, symbol)
        reply = self._replies.get(key)
        if reply is None:
            if len(self._replies) >= _REPLY_CACHE_SIZE:
                self._replies.clear()
            reply = self._replies[key] = Launched(name=name, symbol=symbol)
        return reply

    def fail_all(self, error: DeviceFault) -> int:
        """A device fault: every launch in flight fails with it; returns how many."""
        failed = 0
        for queue in self._queues.values():
            for launch in queue:
                launch.fail(error)
                failed += 1
        self._queues.clear()
        self.in_flight = 0
        self.fault = error
        self.events.clear()
        self._on_fault(error)
        return failed

    async def _run(self) -> None:
        assert self._wake is not None
        idle_since: float | None = None
        sleep = polling.SLEEP_MIN_SECONDS
        while True:
            if not self.in_flight:
                if self._drained is not None and not self._drained.done():
                    self._drained.set_result(None)
                self._wake.clear()
                await self._wake.wait()
                idle_since, sleep = None, polling.SLEEP_MIN_SECONDS
                continue
            if self.harvest():
                idle_since, sleep = None, polling.SLEEP_MIN_SECONDS
                await asyncio.sleep(0)
                continue
            now = time.perf_counter()
            if idle_since is None:
                idle_since = now
            if now - idle_since < polling.SPIN_PHASE_SECONDS:
                if self.in_flight <= 2:  # with many in flight, serve the mailbox instead
                    self.spin(now + polling.SPIN_SECONDS)
                await asyncio.sleep(0)
            else:
                await asyncio.sleep(sleep)
                sleep = min(sleep * 2, polling.SLEEP_MAX_SECONDS)

    async def close(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the launches in flight, then stop polling.

        Launches still running then fail with ActorStopped; their arguments are kept
        alive until the GPU has finished with them. Returns how many were cut off.
        """
        if self.in_flight and self._task is not None:
            self._drained = asyncio.get_running_loop().create_future()
            await asyncio.wait((self._drained,), timeout=timeout)  # the poller resolves them
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        _prune_orphans()
        left = self.in_flight
        if left:
            stopped = ActorStopped(f"the actor stopped before {left} launch(es) completed")
            for queue in self._queues.values():
                for launch in queue:
                    launch.fail(stopped)
                    _ORPHANS.append(launch)
            self._queues.clear()
            self.in_flight = 0
        return left
