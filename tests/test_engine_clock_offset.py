"""The device clock's offset is measured again once it is old by a clock no one steps:
a wall clock stepped back (NTP, ``date -s``, a resumed VM) must not keep an offset that
no longer holds for as long as the step, converting every deadline wrong meanwhile."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from gpuactors.engine import service as service_module
from gpuactors.engine.runtime import CLOCK_RECALIBRATE_SECONDS

START_NS = 1_700_000_000 * 10**9


class Clocks:
    """The wall clock and the monotonic clock, as the service reads them."""

    def __init__(self) -> None:
        self.wall = START_NS
        self.monotonic = 10**12

    def advance(self, seconds: float, wall_step_s: float = 0.0) -> None:
        self.monotonic += int(seconds * 1e9)
        self.wall += int((seconds + wall_step_s) * 1e9)


class CountingRuntime:
    """Counts the service's asks to measure the offset again."""

    def __init__(self) -> None:
        self.asked = 0

    def measure_clock_if_old(self) -> None:
        self.asked += 1


@pytest.mark.parametrize("wall_step_s", [0.0, -3600.0, 3600.0])
def test_an_old_offset_is_measured_again_whatever_the_wall_clock_did(
    monkeypatch: pytest.MonkeyPatch, wall_step_s: float
) -> None:
    clocks = Clocks()
    fake_time = SimpleNamespace(time_ns=lambda: clocks.wall, monotonic_ns=lambda: clocks.monotonic)
    monkeypatch.setattr(service_module, "time", fake_time)
    service = service_module.Service(0, 60.0)
    runtime = CountingRuntime()
    service.runtime = runtime  # type: ignore[assignment]
    service.adopt_clock_offset(1_000)
    clocks.advance(CLOCK_RECALIBRATE_SECONDS / 2, wall_step_s)
    service.deadline_ns(1.0)
    assert runtime.asked == 0  # fresh: half its period has passed, whatever the wall did
    clocks.advance(CLOCK_RECALIBRATE_SECONDS)
    deadline = service.deadline_ns(1.0)
    assert runtime.asked == 1  # old: measured again (the runtime adopts a new offset)
    assert deadline == clocks.wall + 1_000 + 10**9  # (device time: wall time plus offset)


def test_the_real_clocks_are_the_ones_read() -> None:
    assert service_module.time is time
