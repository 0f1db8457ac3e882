"""Whether an engine serves, on which runtime, and the clock its deadlines are in.

Every part of the engine actor reads this (intake refuses tasks by it, the poller
harvests through its runtime, live operators swap its module); only the actor
changes it: it starts the runtime, closes, and declares faults.
"""

from __future__ import annotations

import time

from gpuactors.cuda.generation import GENERATIONS
from gpuactors.engine.runtime import CLOCK_RECALIBRATE_SECONDS, EngineRuntime
from gpuactors.errors import DeviceFault, EngineStopped


class Service:
    """One engine's serving state and device clock."""

    def __init__(self, device_id: int, default_timeout_s: float | None) -> None:
        self.device_id = device_id
        self.runtime: EngineRuntime | None = None  # None until started, and once stopped
        self.generation = 0  # the device's generation when the engine started
        self.faulted: str | None = None  # why the engine is out of service
        self.closing = False  # shutting down: no new tasks
        self.default_timeout_ns = (
            0 if default_timeout_s is None else max(1, int(default_timeout_s * 1e9))
        )
        # Deadlines are in the device's time (its %globaltimer is not the host's clock):
        # host time plus the runtime's measured offset. (default_in_ns: the default
        # deadline's distance from host time, offset included; offset_fresh_until_ns:
        # when the offset is old, and measured again where it can be. That is told by
        # time.monotonic_ns, which no one steps: a wall clock stepped back would keep an
        # offset that no longer holds "fresh" for as long as the step.)
        self.clock_offset_ns = 0
        self.default_in_ns = self.default_timeout_ns
        self.offset_fresh_until_ns = 0

    def check_serving(self) -> None:
        """Raise why a new task is refused (out of service, closing, stale), if it is."""
        self.check_in_service()
        if self.closing or self.runtime is None:
            raise EngineStopped("the engine is shutting down and accepts no new tasks")
        GENERATIONS.check_current("this engine", self.device_id, self.generation)

    def check_in_service(self) -> None:
        """Raise DeviceFault if the engine has faulted (it is out of service for good)."""
        if self.faulted is not None:
            raise DeviceFault(f"this engine is out of service: {self.faulted}")

    def parked_or_faulted(self, runtime: EngineRuntime) -> bool:
        """Has ``runtime``'s kernel parked, or the engine faulted? A faulted kernel never
        parks (it is abandoned, and everything it held has failed): a wait for its park
        ends there, instead of timing out."""
        return not runtime.running or self.faulted is not None

    def deadline_ns(self, timeout: float | None) -> int:
        """A task's deadline in the device's time (``%globaltimer``: host time plus the
        runtime's measured offset); 0: none. Every timeout is at most ``MAX_TIMEOUT_S``
        (the default's too), so a deadline fits the record's word for two centuries."""
        if timeout is None:
            if not self.default_timeout_ns:  # no default: tasks may wait forever
                return 0
            return self.device_now_ns() + self.default_timeout_ns
        # (A timeout under 1 ns is a deadline that has passed, not none.)
        return self.device_now_ns() + int(timeout * 1e9)

    def device_now_ns(self) -> int:
        """Now, in the device's time (what deadlines are compared with), the offset
        measured again first where it is old (:meth:`EngineRuntime.measure_clock_if_old`)."""
        if time.monotonic_ns() >= self.offset_fresh_until_ns and self.runtime is not None:
            self.runtime.measure_clock_if_old()
        return time.time_ns() + self.clock_offset_ns

    def adopt_clock_offset(self, offset_ns: int) -> None:
        """Deadlines from now on are in the device's time as the runtime measured it."""
        self.clock_offset_ns = offset_ns
        self.default_in_ns = self.default_timeout_ns + offset_ns
        self.offset_fresh_until_ns = time.monotonic_ns() + int(CLOCK_RECALIBRATE_SECONDS * 1e9)
