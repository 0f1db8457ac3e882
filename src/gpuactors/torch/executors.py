"""Where a flushed program runs: an engine (local or on another thread's loop), or the
NumPy reference interpreter for CPU tensors.

An executor's ``run`` blocks until the program has run, so when a flush returns, every
result of the batch is in memory: later work on PyTorch's stream sees it, with no
device-side wait that could deadlock. Before the task is published, work already
queued on PyTorch's current stream (that may produce the inputs) is waited for.

Two ways to serve the engine from code that is not a coroutine:

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
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from gpuactors.actors import ActorSystem
from gpuactors.engine import Engine, EngineConfig, Enqueue, InstallOp
from gpuactors.errors import InvalidArgument
from gpuactors.torch import program as P
from gpuactors.torch import reference
from gpuactors.torch.kernel import PROGRAM_OP

Words = Sequence[int] | np.ndarray


class Executor(Protocol):
    """Runs programs; ``device`` is where their tensors live."""

    device: torch.device
    counter: int  # device address of the word the units of a task meet at (0: none)

    def run(self, words: Words, n: int, units: int, stream: Any) -> None: ...


class ReferenceExecutor:
    """Runs programs on CPU tensors with the NumPy interpreter (:mod:`.reference`)."""

    device = torch.device("cpu")
    counter = 0

    def run(self, words: Words, n: int, units: int, stream: Any) -> None:
        reference.run_program(np.asarray(words, dtype=np.uint32))


class EngineHost(Protocol):
    """Something that asks an engine on behalf of code that is not a coroutine."""

    def ask(self, message: Any) -> Any: ...


class EngineExecutor:
    """Runs programs as ``torch_program`` tasks: the program is copied into pinned host
    memory (the op reads it from there) and one task is enqueued and awaited."""

    def __init__(self, host: EngineHost, device_id: int = 0, timeout: float = 30.0) -> None:
        import cupy

        self.host = host
        self.device = torch.device("cuda", device_id)
        self.timeout = timeout
        with cupy.cuda.Device(device_id):
            self._pinned = cupy.cuda.alloc_pinned_memory(P.MAX_WORDS * 4)
        self._words = np.frombuffer(self._pinned, dtype=np.uint32, count=P.MAX_WORDS)
        self._address = int(self._pinned.ptr)
        self._counter = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.counter = int(self._counter.data_ptr())
        #: The reply to the last task (its ``device_ns`` says how long the GPU ran it).
        self.last: Any = None

    def _message(self, words: Words, n: int, units: int) -> Enqueue:
        count = len(words)
        if isinstance(words, np.ndarray):
            self._words[:count] = words
        else:  # a list: one C-level conversion, then a copy
            self._words[:count] = np.frombuffer(array.array("I", words), dtype=np.uint32)
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
        self.last = self.host.ask(self._message(words, n, units))


#: The LocalEngine's default: its kernel parks as soon as it is idle. A device-wide
#: ``torch.cuda.synchronize()`` waits for every kernel on the device, a resident engine
#: kernel included, which otherwise stays up ``idle_park_ms`` (2 ms) after each batch;
#: a relaunch costs a kernel launch instead.
LOCAL_ENGINE_CONFIG = EngineConfig(idle_park_ms=0.0)


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
        self.engine: Engine = self._drive(self._start(config), timeout)

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
        return asyncio.run_coroutine_threadsafe(self.engine.ref.ask(message), self.loop).result()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def attach(engine: Engine, *, device_id: int = 0, **options: Any) -> Any:
    """A scheduler for an engine running on this (the current) event loop.

    Installs the ``torch_program`` op if the engine does not have it (a compile and a
    module swap, once). PyTorch code using the scheduler must run in another thread.
    """
    from gpuactors.torch.scheduler import TorchScheduler

    stats = await engine.stats()
    if not any(name.split("@")[0] == PROGRAM_OP.name for name in stats.ops):
        await engine.ref.ask(InstallOp(op=PROGRAM_OP), timeout=600)
    timeout = options.pop("task_timeout_s", 30.0)
    host = LoopEngine(engine, asyncio.get_running_loop())
    return TorchScheduler(EngineExecutor(host, device_id, timeout), **options)
