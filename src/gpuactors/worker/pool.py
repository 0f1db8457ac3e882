"""The worker processes an isolated engine may turn to: booted spares, and the
budget of replacements it may make before it gives up."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from gpuactors.errors import WorkerError
from gpuactors.worker.config import IsolationConfig
from gpuactors.worker.messages import BootSpec
from gpuactors.worker.process import WorkerProcess

#: The pause before booting a spare again after one failed to boot or died idle; it
#: doubles with each such loss within ``restart_window_s``, up to the cap.
_STANDBY_RETRY_S = 0.5
_STANDBY_RETRY_MAX_S = 30.0


class WorkerPool:
    """Starts workers, keeps ``standbys`` booted spares so a replacement waits on no
    process start, and counts replacements within ``restart_window_s``.

    A spare that fails to boot, or dies before it is used, is booted again after a
    pause that doubles each time; more than ``max_restarts`` such losses within
    ``restart_window_s`` stop the spares (each one costs a process and, on a GPU, a
    context) until the window holds no more than that again (a replacement's refill).
    """

    def __init__(
        self,
        boot: BootSpec,
        isolation: IsolationConfig,
        *,
        is_open: Callable[[], bool],
        on_boot_failed: Callable[[Exception, float | None], None],
    ) -> None:
        self._boot = boot
        self._isolation = isolation
        self._open = is_open  # False once the engine failed or stopped: boot no more spares
        self._on_boot_failed = on_boot_failed  # (why, seconds to the next boot or None: stopped)
        self.standbys: list[WorkerProcess] = []  # booted spares, oldest first
        self.booting: set[asyncio.Task[None]] = set()  # spares being booted
        self._standby_arrived = asyncio.Event()
        self._restarts: deque[float] = deque()  # monotonic times of recent replacements
        self._spares_lost: deque[float] = deque()  # monotonic times of recent spare losses
        self._retry: asyncio.TimerHandle | None = None  # the next boot after a spare's loss

    async def spawn(self) -> WorkerProcess:
        return await WorkerProcess.spawn(
            self._boot,
            python=self._isolation.python,
            module=self._isolation.worker_module,
            timeout=self._isolation.start_timeout_s,
        )

    def refill(self) -> None:
        if not self._open() or self._retry is not None or self._spares_stopped():
            return
        while len(self.standbys) + len(self.booting) < self._isolation.standbys:
            task = asyncio.get_running_loop().create_task(self._boot_standby())
            self.booting.add(task)
            task.add_done_callback(self.booting.discard)

    async def _boot_standby(self) -> None:
        try:
            standby = await self.spawn()
        except Exception as exc:  # e.g. WorkerError, or OSError (out of processes or fds)
            self._spare_lost(exc)
            return
        if not self._open():
            standby.kill()
            return
        self.standbys.append(standby)
        self._standby_arrived.set()

        # A standby that dies (or speaks unasked) while waiting is dropped (and replaced).
        def drop(frame_or_error: object) -> None:
            self._drop_standby(standby, frame_or_error)

        standby.start_reading(drop, drop)

    def _drop_standby(self, standby: WorkerProcess, why: object) -> None:
        if standby in self.standbys:
            self.standbys.remove(standby)
            standby.kill()
            reason = why if isinstance(why, Exception) else f"it sent {type(why).__name__}"
            self._spare_lost(WorkerError(f"a standby worker was lost while idle: {reason}"))

    def _spare_lost(self, why: Exception) -> None:
        """Boot another spare after a pause, unless too many were lost lately."""
        self._spares_lost.append(time.monotonic())
        if not self._open():
            return  # (the engine stopped: no spare is wanted)
        if self._spares_stopped():
            self._on_boot_failed(why, None)
            return
        pause = min(_STANDBY_RETRY_S * 2 ** (len(self._spares_lost) - 1), _STANDBY_RETRY_MAX_S)
        self._on_boot_failed(why, pause)
        if self._retry is None:
            self._retry = asyncio.get_running_loop().call_later(pause, self._retry_due)

    def _spares_stopped(self) -> bool:
        """More than ``max_restarts`` spares lost within ``restart_window_s``: boot none
        (each costs a process and a context) until the window holds fewer."""
        lost = _in_window(self._spares_lost, self._isolation.restart_window_s)
        return lost > self._isolation.max_restarts

    def _retry_due(self) -> None:
        self._retry = None
        self.refill()

    async def next_worker(self) -> WorkerProcess:
        """A booted spare if there is one, else the next spare being booted, else a new one.

        The wait for a spare is a task of its own: it is cancelled however the wait ends
        (the engine stopping cancels this), or it would wait on the event for good."""
        while not self.standbys and self.booting:
            self._standby_arrived.clear()
            arrived = asyncio.ensure_future(self._standby_arrived.wait())
            try:
                await asyncio.wait({arrived, *self.booting}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                arrived.cancel()
        if self.standbys:
            return self.standbys.pop(0)
        return await self.spawn()

    def kill_standbys(self) -> None:
        for standby in self.standbys:
            standby.kill()
        self.standbys.clear()

    def stop(self) -> None:
        """Cancel spares being booted and kill the booted ones."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        for task in self.booting:
            task.cancel()
        self.kill_standbys()

    def replacements_in_window(self) -> int:
        """Count one more replacement now; how many fell within ``restart_window_s``
        (more than ``max_restarts`` fails the engine)."""
        now = time.monotonic()
        self._restarts.append(now)
        return _in_window(self._restarts, self._isolation.restart_window_s, now)


def _in_window(times: deque[float], window_s: float, now: float | None = None) -> int:
    """How many of ``times`` (monotonic, oldest first) fell within the last ``window_s``;
    older ones are dropped."""
    since = (time.monotonic() if now is None else now) - window_s
    while times and times[0] < since:
        times.popleft()
    return len(times)
