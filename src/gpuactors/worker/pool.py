"""The worker processes an isolated engine may turn to: booted spares, and the
budget of replacements it may make before it gives up."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

from gpuactors.worker.config import IsolationConfig
from gpuactors.worker.messages import BootSpec
from gpuactors.worker.process import WorkerProcess


class WorkerPool:
    """Starts workers, keeps ``standbys`` booted spares so a replacement waits on no
    process start, and counts replacements within ``restart_window_s``."""

    def __init__(
        self,
        boot: BootSpec,
        isolation: IsolationConfig,
        *,
        is_open: Callable[[], bool],
        on_boot_failed: Callable[[Exception], None],
    ) -> None:
        self._boot = boot
        self._isolation = isolation
        self._open = is_open  # False once the engine failed or stopped: boot no more spares
        self._on_boot_failed = on_boot_failed
        self.standbys: list[WorkerProcess] = []  # booted spares, oldest first
        self.booting: set[asyncio.Task[None]] = set()  # spares being booted
        self._standby_arrived = asyncio.Event()
        self._restarts: deque[float] = deque()  # monotonic times of recent replacements

    async def spawn(self) -> WorkerProcess:
        return await WorkerProcess.spawn(
            self._boot,
            python=self._isolation.python,
            module=self._isolation.worker_module,
            timeout=self._isolation.start_timeout_s,
        )

    def refill(self) -> None:
        if not self._open():
            return
        while len(self.standbys) + len(self.booting) < self._isolation.standbys:
            task = asyncio.get_running_loop().create_task(self._boot_standby())
            self.booting.add(task)
            task.add_done_callback(self.booting.discard)

    async def _boot_standby(self) -> None:
        try:
            standby = await self.spawn()
        except Exception as exc:  # e.g. WorkerError, or OSError (out of processes or fds)
            self._on_boot_failed(exc)
            return
        if not self._open():
            standby.kill()
            return
        self.standbys.append(standby)
        self._standby_arrived.set()

        # A standby that dies (or speaks unasked) while waiting is dropped (and replaced).
        def drop(_frame_or_error: object) -> None:
            self._drop_standby(standby)

        standby.start_reading(drop, drop)

    def _drop_standby(self, standby: WorkerProcess) -> None:
        if standby in self.standbys:
            self.standbys.remove(standby)
            standby.kill()
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
        for task in self.booting:
            task.cancel()
        self.kill_standbys()

    def replacements_in_window(self) -> int:
        """Count one more replacement now; how many fell within ``restart_window_s``
        (more than ``max_restarts`` fails the engine)."""
        now = time.monotonic()
        self._restarts.append(now)
        while self._restarts and self._restarts[0] < now - self._isolation.restart_window_s:
            self._restarts.popleft()
        return len(self._restarts)
