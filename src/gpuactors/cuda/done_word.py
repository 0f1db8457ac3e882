"""A word in pinned host memory that a stream sets when its work is done.

Asking CUDA whether a stream is done (``cudaStreamQuery``) costs about 1.5 us per
call, so a spin on it sees a finished kernel 0.75 us late on average. Instead, the
launcher queues ``cuStreamWriteValue32(stream, word, token)`` behind the kernel and
spins on the word: one memory read per check. Queuing the write is a host call of
its own (about 1.5 us through cuda-bindings), made while the kernel is starting and
running, so for a small kernel most of it overlaps GPU time. The word is written only
if everything queued before it succeeded; a kernel that faults leaves it unwritten,
and the spin's timeout hands the launch to the event-based path that reports the
fault.

Tokens come from one counter for the whole process, so a write still queued from an
earlier word (or an earlier launch) never carries the token a spin waits for; and a
launch that outlives its spin keeps its word's memory alive until it completes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from gpuactors.cuda import status as cuda_status
from gpuactors.cuda.polling import spin_until_equal

#: ``write(stream_ptr, address, value) -> CUresult``: queue the word's write on a stream.
WriteValue = Callable[[int, int, int], int]

_tokens = itertools.count(1).__next__  # (atomic under the GIL)


class DoneWord:
    """One 32-bit word (``word``, at device-visible ``address``) and the token of the
    last write queued. ``usable`` turns False for good when the driver says stream
    memory operations are not supported (the launcher then queries the stream)."""

    def __init__(
        self, word: memoryview, address: int, write: WriteValue, keepalive: Any = None
    ) -> None:
        self._word = word
        self._write = write
        self._keepalive = keepalive  # what holds the word's memory
        self.address = address
        self.token = 0
        self.usable = True
        word[0] = 0

    def arm(self, stream_ptr: int) -> int | None:
        """Queue the write of a fresh token after the work queued on the stream so far;
        the token, or None where this write could not be queued (not a fault: this
        launch queries its stream instead). A device fault raises DoneWordError."""
        token = _tokens() & 0xFFFF_FFFF or 1  # never 0, the word's first value
        status = self._write(stream_ptr or cuda_status.CU_STREAM_LEGACY, self.address, token)
        if status:
            if status in cuda_status.STICKY:
                raise DoneWordError(status)
            if status == cuda_status.NOT_SUPPORTED:
                self.usable = False
            return None
        self.token = token
        return token

    def wait(self, token: int, seconds: float) -> bool:
        """Spin until the word holds ``token`` (True) or ``seconds`` pass (False)."""
        return spin_until_equal(self._word, 0, token, seconds)


class DoneWordError(RuntimeError):
    """Queuing the word's write failed with a sticky CUDA error (the context faulted)."""

    def __init__(self, status: int) -> None:
        super().__init__(
            f"cuStreamWriteValue32 failed: {cuda_status.error_name(status)} ({status})"
        )
        self.status = status


_STREAMS_KEPT = 64


def device_done_word(cupy: Any) -> DoneWord:
    """A done word in pinned host memory for the current device (cuda-bindings queues
    its writes). Whoever queues a write keeps the word alive until the stream is past
    it (a write into freed pinned memory would land in someone else's)."""
    from cuda.bindings import driver

    memory = cupy.cuda.alloc_pinned_memory(64)
    word = np.frombuffer(memory, dtype=np.uint8, count=4).data.cast("I")
    streams: dict[int, Any] = {}  # cuda-bindings' handle objects, made once per stream

    def write(stream_ptr: int, address: int, value: int) -> int:
        handle = streams.get(stream_ptr)
        if handle is None:
            if len(streams) >= _STREAMS_KEPT:
                streams.clear()
            handle = streams[stream_ptr] = driver.CUstream(stream_ptr)
        (status,) = driver.cuStreamWriteValue32(handle, address, value, 0)
        return int(status)

    return DoneWord(word, memory.ptr, write, keepalive=memory)
