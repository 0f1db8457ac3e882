"""The engine actor on the CPU: a host ring whose consumer stands in for the kernel.

Tests (``tests/test_engine_on_host.py``) and the host-path benchmark
(``benchmarks/bench_host_path.py``) run the real :class:`PersistentEngineActor`, its
poller and its clients over this: no GPU, no compiler. A kick finishes every
published task at once (``auto``), or a test finishes them when it chooses. Not for
serving work: nothing runs the tasks.

It lives in the package, not in ``tests/``, so that both import one copy, and so
that ``mypy --strict`` keeps it in step with the actor it stands under.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from gpuactors.cuda import arrays as arrays_module
from gpuactors.engine import args as args_module
from gpuactors.engine import optable as optable_module
from gpuactors.engine.abi import BATCH_DESC, BATCH_OP, COMPLETION, RING_RECORD, STATUS_BATCH_FAILED
from gpuactors.engine.actor import PersistentEngineActor
from gpuactors.engine.live_ops import LiveOps
from gpuactors.engine.ops import OpSpec
from gpuactors.engine.ring import HostConsumer, HostRing, u64_words

#: What a finished task's status is, from its sequence number and decoded record.
StatusOf = Callable[[int, Any], int]
#: The function each module calls for CuPy's array type (each imported its own name).
_CUPY_NDARRAY = "cupy_ndarray"


class Memory:
    """What the engine reads of a CuPy array's ``data``."""

    def __init__(self, ptr: int, device_id: int) -> None:
        self.ptr = ptr
        self.device_id = device_id


class Flags:
    """A CuPy array's ``flags``, as far as the engine reads them."""

    def __init__(self, c_contiguous: bool = True) -> None:
        self.c_contiguous = c_contiguous


class CupyLikeArray:
    """What the engine reads of a CuPy array (its type stands in for CuPy's ndarray:
    see :func:`cupy_like_arrays`)."""

    flags = Flags()

    def __init__(
        self, dtype: Any, size: int, ptr: int = 0x7F00_0000_0000, device_id: int = 0
    ) -> None:
        self.dtype = np.dtype(dtype)
        self.size = size
        self.data = Memory(ptr, device_id)


@contextmanager
def cupy_like_arrays() -> Iterator[None]:
    """Within the block, :class:`CupyLikeArray` is what the engine takes for CuPy's
    array type on every path (the publisher's too). Only engines started
    inside the block see it: an op's publisher is built when the engine starts."""
    modules = (args_module, arrays_module, optable_module)
    saved = [getattr(module, _CUPY_NDARRAY) for module in modules]
    for module in modules:
        setattr(module, _CUPY_NDARRAY, lambda: CupyLikeArray)
    try:
        yield
    finally:
        for module, original in zip(modules, saved, strict=True):
            setattr(module, _CUPY_NDARRAY, original)


class HostBytes:
    """The host runtime's "device memory": host bytes at a real address."""

    def __init__(self, nbytes: int) -> None:
        self.memory = np.zeros(nbytes, dtype=np.uint8)
        self.ptr = int(self.memory.ctypes.data)

    def copy_in(self, offset: int, host: np.ndarray) -> None:
        self.memory[offset : offset + host.nbytes] = host.view(np.uint8).reshape(-1)

    def wait(self) -> None:
        pass

    def read(self, offset: int, count: int, dtype: np.dtype[Any]) -> np.ndarray:
        return self.memory[offset : offset + count * dtype.itemsize].view(dtype).copy()


class HostRuntime:
    """What the actor uses of an EngineRuntime, over a host ring. ``auto``: every kick
    finishes every published task (unless held); else a test calls :meth:`finish`.
    ``keep_records``: finishing decodes each task's record and keeps it in ``taken``
    (what tests look at); without it, tasks are finished word by word with status 0,
    the cheapest stand-in for the device (what the benchmark wants)."""

    def __init__(self, capacity: int = 64, auto: bool = True, keep_records: bool = True) -> None:
        records = np.zeros(capacity, dtype=RING_RECORD)
        completions = np.zeros(capacity, dtype=COMPLETION)
        records["seq"] = np.arange(capacity, dtype=np.uint64)
        self.ring = HostRing(records, completions)
        self.consumer = HostConsumer(records, completions)
        self._record_words = u64_words(records)
        self._done_words = u64_words(completions)
        self.auto = auto
        self.keep_records = keep_records
        self.hold = False
        self.running = False
        self.launch_error: Exception | None = None
        self.control = np.zeros(8, dtype=np.uint64)
        self.exit_reason = 0
        self.launches = 0
        self.mode_persistent = True
        self.grid = 2
        self.taken: list[tuple[int, Any]] = []
        self.swap_seconds = 0.0
        self.parks_on_request = True
        self.clock_offset_ns = 0  # (the host clock is the device's here)
        self.on_clock_offset: Callable[[int], None] | None = None
        self.kicks = 0
        self.finished = 0  # tasks finished by kicks and finish calls
        self.device_seconds = 0.0  # spent finishing tasks (the stand-in device's time)
        self.abandoned: tuple[Any, ...] = ()  # what abandon was given to keep
        #: What allocate lent and is still held (by its batch), by address.
        self.buffers: weakref.WeakValueDictionary[int, HostBytes] = weakref.WeakValueDictionary()
        #: The status of task ``index`` of an expanded record (its index in that record),
        #: when ``finish`` runs the record.
        self.batch_task_status: Callable[[int], int] = lambda index: 0

    @property
    def consumed(self) -> int:
        return int(self.consumer.tail)

    def kick(self) -> bool:
        self.kicks += 1
        if not self.hold and self.auto:
            if self.keep_records:
                self.finish()
            else:
                self.finish_quickly()
        return False

    def allocate(self, nbytes: int) -> HostBytes:
        buffer = HostBytes(nbytes)
        self.buffers[buffer.ptr] = buffer
        return buffer

    def finish(self, status_of: StatusOf = lambda seq, record: 0) -> int:
        """Take and finish every published task (``status_of(seq, record)`` each; an
        expanded batch's record: ``batch_task_status`` of each of its tasks)."""
        started = time.perf_counter()
        finished = 0
        while taken := self.consumer.take():
            for seq, record in taken:
                self.taken.append((seq, record))
                if int(record["op"]) == BATCH_OP:
                    status = self._run_batch(int(record["args"][0]))
                else:
                    status = status_of(seq, record)
                self.consumer.complete(seq, status)
                finished += 1
        self.finished += finished
        self.device_seconds += time.perf_counter() - started
        return finished

    def _run_batch(self, desc_ptr: int) -> int:
        """An expanded record, as the kernel runs it: each task's status written where
        its descriptor says; the record's status."""
        buffer = next(
            (
                held
                for held in self.buffers.values()
                if held.ptr <= desc_ptr < held.ptr + len(held.memory)
            ),
            None,
        )
        assert buffer is not None, f"no batch holds descriptor {desc_ptr:#x} (freed early?)"
        at = desc_ptr - buffer.ptr
        desc = buffer.memory[at : at + BATCH_DESC.itemsize].view(BATCH_DESC)[0]
        count = int(desc["count"])
        statuses = np.array([self.batch_task_status(index) for index in range(count)], np.int32)
        buffer.copy_in(int(desc["statuses"]) - buffer.ptr, statuses)
        return STATUS_BATCH_FAILED if statuses.any() else 0

    def finish_quickly(self) -> int:
        """Finish every published task with status 0, one unit, no decoding: the
        steps of ``HostConsumer.take`` and ``complete`` on the ring's words."""
        started = time.perf_counter()
        records, done, mask = self._record_words, self._done_words, self.ring.mask
        record_words = RING_RECORD.itemsize // 8
        done_words = COMPLETION.itemsize // 8
        capacity = self.ring.capacity
        pos = first = self.consumer.tail
        while True:
            slot = pos & mask
            if records[slot * record_words] != pos + 1:  # not published (yet)
                break
            base = slot * done_words
            done[base + 1] = 1 << 32  # status 0, one unit
            done[base + 2] = done[base + 3] = 0  # (no device times)
            done[base] = pos + 1  # the marker last
            records[slot * record_words] = pos + capacity  # the slot to the next lap
            pos += 1
        self.consumer.tail = pos
        self.finished += pos - first
        self.device_seconds += time.perf_counter() - started
        return pos - first

    def request_park(self) -> None:
        if self.parks_on_request:
            self.running = False

    def check_fault(self) -> None:
        pass

    def measure_clock_if_old(self) -> None:
        pass  # (the host clock is the device's here)

    def swap_module(self, _image: bytes) -> None:
        time.sleep(self.swap_seconds)  # (a worker thread's module load)

    def abandon(self, keepalive: Any = ()) -> None:
        self.hold = True
        self.abandoned = tuple(keepalive)  # (as the real runtime does: kept for good)

    def close(self) -> None:
        pass


class NoModules(LiveOps):
    """Live operators with no compiler: every engine module is an empty image (the
    host runtime loads nothing)."""

    async def engine_image(self, ops: Sequence[OpSpec], ids: dict[str, int]) -> bytes:
        return b""


class HostEngine(PersistentEngineActor):
    """The engine actor with a host runtime, and no compiler."""

    _live_ops_class = NoModules

    def __init__(self, runtime: HostRuntime, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._host_runtime = runtime

    async def pre_start(self) -> None:
        self._serve(self._host_runtime)  # type: ignore[arg-type]
