"""Device generations: a counter per device that moves whenever its context is rebuilt.

Everything tied to a context (kernel handles, engine instances, buffers we
hand out) records the generation it was made in. :func:`check_current` turns
use of an older one into :class:`~gpuactors.errors.GpuRefStale` before anything
reaches the GPU. Observers can await the next change.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping

from gpuactors.errors import GpuRefStale

#: Every device's generation until its context is first rebuilt.
FIRST_GENERATION = 1


class GenerationRegistry:
    """Process-wide generation counters, one per device ordinal."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generations: dict[int, int] = {}
        #: device ordinal -> its generation, for per-task paths that cannot afford
        #: a call: ``by_device.get(device_id, FIRST_GENERATION)`` is ``current``.
        #: A live view: ``_generations`` is only ever changed in place, never rebound.
        self.by_device: Mapping[int, int] = self._generations
        self._waiters: dict[int, list[tuple[asyncio.AbstractEventLoop, asyncio.Future[int]]]] = {}

    def current(self, device_id: int) -> int:
        # One dict read is atomic: no lock on this per-launch path (writers hold it).
        return self._generations.get(device_id, FIRST_GENERATION)

    def bump(self, device_id: int) -> int:
        """Start a new generation (after a context rebuild); wakes every waiter."""
        with self._lock:
            generation = self._generations.get(device_id, FIRST_GENERATION) + 1
            self._generations[device_id] = generation
            waiters = self._waiters.pop(device_id, [])
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_settle, future, generation)
            except RuntimeError:  # its loop was closed: nothing awaits that future any more
                continue  # (and the waiters on live loops must still wake)
        return generation

    async def next_change(self, device_id: int, after: int | None = None) -> int:
        """Wait until the generation of ``device_id`` is newer than ``after`` (default: now)."""
        loop = asyncio.get_running_loop()
        while True:
            with self._lock:
                now = self._generations.get(device_id, FIRST_GENERATION)
                if after is None:
                    after = now
                elif now > after:
                    return now
                future: asyncio.Future[int] = loop.create_future()
                self._waiters.setdefault(device_id, []).append((loop, future))
            try:
                await future  # a bump: newer than ``after`` once it has passed it
            finally:
                with self._lock:
                    waiters = self._waiters.get(device_id, [])
                    if (loop, future) in waiters:
                        waiters.remove((loop, future))

    def check_current(self, what: str, device_id: int, made_in: int) -> None:
        """Raise GpuRefStale if ``made_in`` is not the device's current generation."""
        now = self.current(device_id)
        if made_in != now:
            raise GpuRefStale(what, made_in, now)


def _settle(future: asyncio.Future[int], generation: int) -> None:
    if not future.done():
        future.set_result(generation)


GENERATIONS = GenerationRegistry()
