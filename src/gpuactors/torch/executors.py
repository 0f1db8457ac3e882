"""Where a flushed program runs: a kernel launch on PyTorch's stream, an engine (local
or on another thread's loop), or the NumPy reference interpreter for CPU tensors.

:class:`StreamExecutor` launches the interpreter as an ordinary kernel on the batch's
stream and returns: the stream orders it after the work that may produce its inputs
and before the work that reads its results, as it orders PyTorch's own kernels.

An engine executor's ``run`` blocks until the program has run, so when a flush
returns, every result of the batch is in memory: later work on PyTorch's stream sees
it, with no device-side wait that could deadlock. Before the task is published, work
already queued on PyTorch's current stream (that may produce the inputs) is waited
for. Two ways to serve the engine from code that is not a coroutine:

* :class:`LocalEngine` owns an engine on a private event loop that runs only while
  a flush (or anything else of it) waits: nothing to start, no thread, and a flush
  costs one engine round trip. For synchronous programs.
* :class:`LoopEngine` wraps an engine running on an event loop in another thread
  (an asyncio program runs its PyTorch code in a worker thread, say with
  ``asyncio.to_thread``); a flush is one cross-thread ask.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import ctypes
import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from gpuactors.actors import ActorSystem
from gpuactors.cuda import status as cuda_status
from gpuactors.cuda.current import on_device
from gpuactors.cuda.device import probe_device
from gpuactors.cuda.loader import load_module
from gpuactors.engine import Engine, EngineConfig, Enqueue, InstallOp
from gpuactors.errors import EngineStopped, InvalidArgument, TaskFailed
from gpuactors.nvrtc import NvrtcOpts, default_compiler
from gpuactors.nvrtc.launch import cuda_error
from gpuactors.torch import program as P
from gpuactors.torch import reference
from gpuactors.torch.batch import ENGINE_SPREAD, STREAM_SPREAD, UnitSpread
from gpuactors.torch.kernel import (
    PROGRAM_OP,
    STREAM_BLOCK_THREADS,
    STREAM_CAPACITIES,
    STREAM_SOURCE,
    stream_kernel_name,
)

if TYPE_CHECKING:
    from gpuactors.torch.scheduler import TorchScheduler

Words = Sequence[int] | np.ndarray


class Executor(Protocol):
    """Runs programs; ``device`` is where their tensors live, ``spread`` how many units
    a program should be spread over there. A program comes without ticket and
    counter: the executor stamps its own (:class:`MeetingPoints`)."""

    device: torch.device
    spread: UnitSpread

    def run(self, words: Words, n: int, units: int, stream: Any) -> None: ...


class ReferenceExecutor:
    """Runs programs on CPU tensors with the NumPy interpreter (:mod:`.reference`)."""

    device = torch.device("cpu")
    spread = ENGINE_SPREAD

    def run(self, words: Words, n: int, units: int, stream: Any) -> None:
        reference.run_program(np.asarray(words, dtype=np.uint32))


class MeetingPoints:
    """Where the units of one run meet: the ticket and counter in its program's header.

    Every run gets the next ticket and the counter of ``ticket % slots``. A unit that
    finds its counter tagged with another ticket starts the count afresh, so a run
    never inherits another's count; runs that may be in flight at once (on different
    streams) get different counters as long as fewer than ``slots`` are. A run launched
    while a CUDA graph is captured keeps its ticket and counter for every replay of the
    graph, so it gets one of ``graph_slots`` counters that no other run ever uses.
    """

    def __init__(self, device: torch.device, slots: int, graph_slots: int = 0) -> None:
        self._counters = torch.zeros(slots + graph_slots, dtype=torch.int64, device=device)
        if device.type == "cuda":  # zeroed before any stream's run can meet there
            torch.cuda.synchronize(device)
        self._base = int(self._counters.data_ptr())
        self._slots = slots
        self._graph_slots = graph_slots
        #: Runs stamped so far: the last run's ticket.
        self.runs = 0
        #: Runs stamped for a CUDA graph so far (each holds its counter for good).
        self.graph_runs = 0

    def stamp(self, program: np.ndarray, for_graph: bool = False) -> None:
        """Give ``program`` (the run's own copy) the next ticket and its counter;
        ``for_graph``: the run is being captured in a CUDA graph."""
        slot = (self.runs + 1) % self._slots
        if for_graph:
            if self.graph_runs == self._graph_slots:
                raise InvalidArgument(
                    f"this executor has given all its {self._graph_slots} meeting counters "
                    "for runs captured in CUDA graphs; capture with another executor"
                )
            slot = self._slots + self.graph_runs
            self.graph_runs += 1
        self.runs += 1
        counter = self._base + 8 * slot
        program[3] = self.runs & 0xFFFFFFFF
        program[4] = counter & 0xFFFFFFFF
        program[5] = counter >> 32


class EngineHost(Protocol):
    """Something that asks an engine on behalf of code that is not a coroutine."""

    def ask(self, message: Any) -> Any: ...


class EngineExecutor:
    """Runs programs as ``torch_program`` tasks: the program is copied into pinned host
    memory (the op reads it from there) and one task is enqueued and awaited. One run
    at a time: they share the pinned buffer, and one counter serves them all."""

    def __init__(self, host: EngineHost, device_id: int = 0, timeout: float = 30.0) -> None:
        import cupy

        self.host = host
        self.device = torch.device("cuda", device_id)
        self.spread = ENGINE_SPREAD
        self.timeout = timeout
        with cupy.cuda.Device(device_id):
            self._pinned = cupy.cuda.alloc_pinned_memory(P.MAX_WORDS * 4)
        self._words = np.frombuffer(self._pinned, dtype=np.uint32, count=P.MAX_WORDS)
        self._address = int(self._pinned.ptr)
        self.meeting_points = MeetingPoints(self.device, slots=1)
        self._lock = threading.Lock()
        #: The reply to the last task (its ``device_ns`` says how long the GPU ran it).
        self.last: Any = None

    def _message(self, words: Words, n: int, units: int) -> Enqueue:
        count = _write_words(self._words, words)
        self.meeting_points.stamp(self._words)
        return Enqueue(
            op=PROGRAM_OP.name,
            args=(self._address, count),
            n=n,
            blocks=units,
            timeout=self.timeout,
            after="none",
        )

    def run(self, words: Words, n: int, units: int, stream: Any) -> None:
        if stream is not None and not stream.query():
            stream.synchronize()  # the inputs may come from work queued there
        with self._lock:
            self.last = self.host.ask(self._message(words, n, units))


def _write_words(buffer: np.ndarray, words: Words) -> int:
    """Copy a program into the front of ``buffer``; its length in words."""
    count = len(words)
    if isinstance(words, np.ndarray):
        buffer[:count] = words
    else:  # a list: one C-level conversion, then a copy
        buffer[:count] = np.frombuffer(array.array("I", words), dtype=np.uint32)
    return count


#: Counters of a StreamExecutor: more than launches in flight on different streams at
#: once (launches on one stream run one after another).
COUNTER_SLOTS = 4096
#: Counters of a StreamExecutor for launches captured in CUDA graphs, one each for good.
GRAPH_COUNTER_SLOTS = 65536


@dataclass(frozen=True)
class _StreamKernel:
    """One stream kernel: its function, and the parameter values a launch of it reads
    (``program``, refilled per launch) behind the pointer array ``cuLaunchKernel`` gets."""

    capacity: int
    function: int
    program: np.ndarray
    params: Any  # ctypes array of pointers: program, length, failure word

    @property
    def params_address(self) -> int:
        return ctypes.addressof(self.params)


class StreamExecutor:
    """Runs each program as one kernel launch on PyTorch's stream: no engine, no wait.

    A flush costs one launch and returns. The stream orders the launch like a PyTorch
    kernel: after the work queued there before it, before the work queued after it;
    ``.item()``, ``.cpu()`` and ``torch.cuda.synchronize()`` wait for it as for any
    other. The program travels by value as the kernel's parameter (the driver copies
    it during the launch call), so its host buffer is free again when the call returns.

    The kernels (:data:`.kernel.STREAM_SOURCE`) are the engine op's interpreter, compiled
    once per architecture through gpuactors' kernel caches (memory and disk) and loaded
    once per device for the process. A failure a kernel reports (a malformed program,
    which the scheduler never builds) is raised as :class:`TaskFailed` by :meth:`check`
    or after a launch (a later one, or its own if the kernel was quick enough), once the
    failed kernel has finished.

    Launches still queued use the executor's counters and failure word: keep an
    executor as long as its work may run. :meth:`shared` (what :func:`stream_scheduler`
    uses) gives the process's own executor per device, which is never freed.
    """

    def __init__(self, device_id: int = 0) -> None:
        import cupy

        arch = probe_device(device_id).arch  # (NoCudaDevice if there is no such device)
        self.device = torch.device("cuda", device_id)
        self.device_id = device_id
        self.spread = STREAM_SPREAD
        self._current_context = cupy.cuda.driver.ctxGetCurrent
        self._set_device = cupy.cuda.runtime.setDevice
        # Not ``_bind_thread()`` here: the creating thread (the user's, often still
        # without a CUDA context) keeps its own current device; ``on_device`` gives
        # it back after each step.
        self._module = _interpreter_module(device_id, arch)
        with on_device(device_id):
            self._failure_memory = cupy.cuda.alloc_pinned_memory(8)
        self._failure = np.frombuffer(self._failure_memory, dtype=np.uint32, count=2)
        self._failure[:] = 0  # code, ticket
        self.meeting_points = MeetingPoints(self.device, COUNTER_SLOTS, GRAPH_COUNTER_SLOTS)
        self._length = ctypes.c_uint32(0)
        self._failure_address = ctypes.c_uint64(int(self._failure_memory.ptr))
        self._kernels = tuple(self._kernel(capacity) for capacity in STREAM_CAPACITIES)
        self._lock = threading.Lock()  # the parameter values are shared by every launch
        self._launch = cupy.cuda.driver.launchKernel

    @classmethod
    def shared(cls, device_id: int = 0) -> StreamExecutor:
        """The process's executor for ``device_id``, made on first use."""
        with _SHARED_LOCK:
            executor = _SHARED.get(device_id)
            if executor is None:
                executor = _SHARED[device_id] = cls(device_id)
            return executor

    def _kernel(self, capacity: int) -> _StreamKernel:
        program = np.zeros(capacity, dtype=np.uint32)
        params = (ctypes.c_void_p * 3)(
            program.ctypes.data,
            ctypes.addressof(self._length),
            ctypes.addressof(self._failure_address),
        )
        function = self._module.get_function(stream_kernel_name(capacity))
        return _StreamKernel(capacity, int(function.ptr), program, params)

    def run(self, words: Words, n: int, units: int, stream: Any) -> None:
        if stream is None:
            stream = torch.cuda.current_stream(self.device_id)
        kernel = self._kernel_for(len(words))
        with self._lock:
            program = kernel.program
            self._length.value = _write_words(program, words)
            self.meeting_points.stamp(program, torch.cuda.is_current_stream_capturing())
            try:
                self._bind_thread()
                with on_device(self.device_id):
                    self._launch(
                        kernel.function,
                        units, 1, 1,
                        STREAM_BLOCK_THREADS, 1, 1,
                        0,
                        stream.cuda_stream or cuda_status.CU_STREAM_LEGACY,
                        kernel.params_address,
                        0,
                    )  # fmt: skip
            except Exception as exc:
                raise cuda_error(exc, "launching a torch program") from exc
            # This batch is launched: an earlier one's failure no longer costs it.
            self._raise_failure()

    def _kernel_for(self, count: int) -> _StreamKernel:
        for kernel in self._kernels:
            if count <= kernel.capacity:
                return kernel
        raise InvalidArgument(f"a program of {count} words: the kernels hold {P.MAX_WORDS}")

    def check(self) -> None:
        """Raise :class:`TaskFailed` if a program that ran so far reported a failure
        (call it after a synchronize to cover every launch)."""
        with self._lock:
            self._raise_failure()

    def _raise_failure(self) -> None:
        code = int(self._failure[0])
        if code:
            ticket = int(self._failure[1])
            self._failure[0] = 0
            raise TaskFailed(PROGRAM_OP.name, ticket, code)

    def _bind_thread(self) -> None:
        """Give a thread with no CUDA context yet (one that never made a CUDA call: a
        timer's, a pool's) this device's: the driver's launch needs a current context,
        and ``on_device`` would otherwise create device 0's to go back to."""
        if not self._current_context():
            self._set_device(self.device_id)


_SHARED: dict[int, StreamExecutor] = {}
_SHARED_LOCK = threading.Lock()


@functools.cache
def _interpreter_module(device_id: int, arch: str) -> Any:
    """The stream kernels' module, loaded on ``device_id`` (of ``arch``) once: a module
    is never unloaded under a launch still queued on some stream."""
    compiled, _origin = default_compiler().get_or_compile(
        STREAM_SOURCE, name="gpt_stream.cu", opts=NvrtcOpts(std="c++17"), arch=arch
    )
    with on_device(device_id):
        return load_module(compiled.image)


def stream_scheduler(device_id: int = 0, **options: Any) -> TorchScheduler:
    """A :class:`~.scheduler.TorchScheduler` whose batches run as kernel launches on
    PyTorch's stream (the process's :meth:`StreamExecutor.shared` for the device): the
    way for code that is not served by an engine of its own. ``options`` go to the
    scheduler."""
    from gpuactors.torch.scheduler import TorchScheduler

    return TorchScheduler(StreamExecutor.shared(device_id), **options)


#: The LocalEngine's default: its kernel parks as soon as it is idle. A device-wide
#: ``torch.cuda.synchronize()`` waits for every kernel on the device, a resident engine
#: kernel included, which otherwise stays up ``idle_park_ms`` (2 ms) after each batch;
#: a relaunch costs a kernel launch instead.
LOCAL_ENGINE_CONFIG = EngineConfig(idle_park_ms=0.0)


#: How long a LocalEngine whose start failed waits for its actor system to stop.
_ABANDON_TIMEOUT_S = 60.0


class LocalEngine:
    """An engine with the tiny-op op, served by the calling thread's own private loop.

    ``with LocalEngine() as engine: scheduler = engine.scheduler()``. The loop runs
    only inside this object's calls (a flush, ``close``), so it must not be used from
    a thread that is running an event loop already (use :func:`attach` there). Its
    kernel parks at once when idle (``LOCAL_ENGINE_CONFIG``; pass ``config`` to change).
    """

    def __init__(
        self,
        *,
        device_id: int = 0,
        config: EngineConfig | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.device_id = device_id
        self._loop = asyncio.new_event_loop()
        self._lock = threading.Lock()  # one thread drives the loop at a time
        self._system = ActorSystem("gpuactors-torch")
        self._closed = False
        try:
            self.engine: Engine = self._drive(self._start(config), timeout)
        except BaseException:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """After a start that failed (or was refused): stop what it started (the system,
        an engine actor it spawned) and close the private loop, which nothing else would
        (the caller gets no object to close)."""
        self._closed = True
        try:
            if _running_loop() is None:  # (else the start never ran: nothing to stop)
                with contextlib.suppress(Exception):  # (the start's failure is what is told)
                    self._loop.run_until_complete(
                        asyncio.wait_for(self._system.shutdown(), _ABANDON_TIMEOUT_S)
                    )
                left = asyncio.all_tasks(self._loop)  # (what a shutdown that failed left)
                for task in left:
                    task.cancel()
                if left:
                    self._loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        finally:
            self._loop.close()

    async def _start(self, config: EngineConfig | None) -> Engine:
        await self._system.__aenter__()
        return await Engine.start(
            self._system,
            ops=(PROGRAM_OP,),
            config=config or LOCAL_ENGINE_CONFIG,
            device_id=self.device_id,
        )

    def _drive(self, work: Any, timeout: float | None = None) -> Any:
        running = _running_loop()
        if running is not None:
            work.close()
            raise InvalidArgument(
                "a LocalEngine cannot be served from a thread whose event loop is running: "
                "attach the scheduler to an engine on that loop (gpuactors.torch.attach) "
                "and run the PyTorch code in a worker thread"
            )
        with self._lock:
            if self._closed:
                work.close()
                raise InvalidArgument("this LocalEngine is closed")
            return self._loop.run_until_complete(
                work if timeout is None else asyncio.wait_for(work, timeout)
            )

    def ask(self, message: Any) -> Any:
        return self._drive(self.engine.ref.ask(message))

    def scheduler(self, **options: Any) -> Any:
        """A :class:`~.scheduler.TorchScheduler` running its batches on this engine."""
        from gpuactors.torch.scheduler import TorchScheduler

        timeout = options.pop("task_timeout_s", 30.0)
        return TorchScheduler(EngineExecutor(self, self.device_id, timeout), **options)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._drive(self._stop(), 120.0)
        finally:
            self._closed = True
            self._loop.close()

    async def _stop(self) -> None:
        await self.engine.shutdown(timeout=60)
        await self._system.shutdown()

    def __enter__(self) -> LocalEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: How often a flush waiting on an engine's loop checks that the loop still runs.
_LOOP_CHECK_S = 0.5


class LoopEngine:
    """An engine running on an event loop in another thread, asked from this one."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self.loop = loop

    def ask(self, message: Any) -> Any:
        if _running_loop() is self.loop:
            raise InvalidArgument(
                "a flush would block the engine's own event loop: run the PyTorch code "
                "in a worker thread (asyncio.to_thread); await scheduler.flush_async() here"
            )
        if self.loop.is_closed():
            raise EngineStopped("the engine's event loop is closed")
        answer = asyncio.run_coroutine_threadsafe(self.engine.ref.ask(message), self.loop)
        while True:  # (a loop that stops without closing would never run the ask)
            try:
                return answer.result(timeout=_LOOP_CHECK_S)
            except TimeoutError:
                if not self.loop.is_running():
                    answer.cancel()
                    raise EngineStopped("the engine's event loop stopped") from None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def attach(engine: Engine, *, device_id: int | None = None, **options: Any) -> Any:
    """A scheduler for an engine running on this (the current) event loop.

    Its tensors live on the engine's device (``device_id``, if given, must be that one:
    a program runs where its engine is). Installs the ``torch_program`` op if the
    engine does not have it (a compile and a module swap, once). PyTorch code using the
    scheduler must run in another thread.
    """
    from gpuactors.torch.scheduler import TorchScheduler

    if device_id is None:
        device_id = engine.device_id
    elif device_id != engine.device_id:
        raise InvalidArgument(
            f"attach(device_id={device_id!r}) for an engine on device {engine.device_id}: "
            "a scheduler's tensors live on its engine's device"
        )
    stats = await engine.stats()
    if not any(name.split("@")[0] == PROGRAM_OP.name for name in stats.ops):
        await engine.ref.ask(InstallOp(op=PROGRAM_OP), timeout=600)
    timeout = options.pop("task_timeout_s", 30.0)
    host = LoopEngine(engine, asyncio.get_running_loop())
    return TorchScheduler(EngineExecutor(host, device_id, timeout), **options)
