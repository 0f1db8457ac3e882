"""The deadline watchdog: a worker that leaves a request unanswered long past its
deadline is stuck (no fault report will come), so it is declared lost."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from gpuactors.engine.messages import Drain, InstallOp, PrepareOp, ReplaceOp, Shutdown
from gpuactors.engine.parks import ParkHolds
from gpuactors.engine.runtime import EngineConfig
from gpuactors.errors import InvalidArgument
from gpuactors.messages import Message
from gpuactors.nvrtc.messages import CompileRequest
from gpuactors.worker.config import IsolationConfig
from gpuactors.worker.requests import PendingRequest

_WATCHDOG_SECONDS = 0.25


class DeadlineWatchdog:
    """Checks the requests in flight every quarter second; pauses while parked."""

    def __init__(
        self,
        engine_config: EngineConfig,
        isolation: IsolationConfig,
        in_flight: Callable[[], list[PendingRequest]],
        on_stuck: Callable[[str], None],
    ) -> None:
        self._engine_config = engine_config
        self._isolation = isolation
        self._in_flight = in_flight
        self._on_stuck = on_stuck
        # The Parks in force in the serving worker, kept as its engine keeps them: they
        # count and may be named, so one Resume need not end them all.
        self._holds = ParkHolds()
        # A non-forced Shutdown was sent: the worker's engine ended every Park and takes
        # no new one, so a Park answered after it holds nothing.
        self._parks_over = False
        self._task: asyncio.Task[None] | None = None

    @property
    def parked(self) -> bool:
        """A Park is in force: tasks wait in the ring on purpose, so deadlines pause."""
        return bool(len(self._holds))

    def park_answered(self, hold: int | None) -> None:
        """The worker answered a Park: it holds until its Resume."""
        if self._parks_over:
            return
        with contextlib.suppress(InvalidArgument):  # (a name that holds: the worker refuses)
            self._holds.answered(self._holds.take(hold))

    def resume_answered(self, hold: int | None) -> None:
        """The worker answered a Resume: it ended that Park (or, unnamed, one plain Park)."""
        self._holds.resume(hold)

    def shutdown_sent(self) -> None:
        """A non-forced Shutdown goes to the worker: its engine ends every Park as it
        takes it ("Draining ends every Park") and drains what they held. Deadlines count
        again from here, so a request that stalls in that drain is caught."""
        self._holds.clear()
        self._parks_over = True

    def new_worker(self) -> None:
        """A new worker serves: no Park holds it."""
        self._holds = ParkHolds()
        self._parks_over = False

    def deadline_of(self, message: Message) -> float:
        """The monotonic time by which the worker must answer ``message`` (inf: never
        counts as stuck)."""
        return time.monotonic() + self._budget(message)

    def _budget(self, message: Message) -> float:
        if isinstance(message, Drain) or (
            isinstance(message, Shutdown) and not message.force and self._parks_over
        ):
            # It lasts as long as the requests it waits for (a Shutdown sent to a parked
            # worker drains all a Park held), which the watchdog times by their own
            # deadlines; some may be longer than its own would be. Any other Shutdown
            # follows a Drain: it only closes, and a worker that wedges there is stuck.
            return float("inf")
        timeout = getattr(message, "timeout", None) or self._engine_config.default_task_timeout_s
        budget = (timeout or 0.0) + self._engine_config.hang_grace_ms / 1e3
        if isinstance(message, InstallOp | ReplaceOp | PrepareOp | CompileRequest):
            budget += self._isolation.start_timeout_s  # a cold compile, an op's or a kernel's
        return budget + self._isolation.unresponsive_s if timeout else float("inf")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(_WATCHDOG_SECONDS)
            now = time.monotonic()
            if self.parked:
                for request in self._in_flight():
                    request.deadline += _WATCHDOG_SECONDS
                continue
            late = [r for r in self._in_flight() if r.deadline < now]
            if late:
                self._on_stuck(
                    f"the worker did not answer {type(late[0].message).__name__} "
                    f"{self._isolation.unresponsive_s:g} s past its deadline (stuck)"
                )
