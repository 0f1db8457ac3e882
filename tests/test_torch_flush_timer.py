"""FlushTimer (gpuactors.torch.flush_timer) needs no PyTorch: batches here are plain
objects with the three attributes the timer reads."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from gpuactors.torch.flush_timer import FlushTimer


@dataclass
class FakeBatch:
    ops: int = 0
    started: float = 0.0
    traced: bool = False


class Scheduler:
    """What the timer is given: the open batch, and a flush that swaps it for a new one."""

    def __init__(self, period_s: float) -> None:
        self.batch = FakeBatch()
        self.flushed: list[tuple[FakeBatch, float]] = []
        self.lock = threading.Lock()
        self.timer = FlushTimer(period_s, lambda: self.batch, self.flush_overdue)
        self.wakes = 0
        wake = self.timer.wake

        def counted() -> None:
            self.wakes += 1
            wake()

        self.timer.wake = counted  # type: ignore[method-assign]

    def flush_overdue(self, batch: FakeBatch) -> None:
        with self.lock:
            if self.batch is batch and not batch.traced:
                self.flushed.append((batch, time.perf_counter()))
                self.batch = FakeBatch()

    def begin(self) -> FakeBatch:
        with self.lock:
            self.batch = FakeBatch(ops=1, started=time.perf_counter())
            self.timer.batch_began()
            return self.batch

    def flush(self) -> None:
        with self.lock:
            self.batch = FakeBatch()


def wait_for(condition: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.002)


def test_a_batch_left_open_is_flushed_at_its_deadline_not_before() -> None:
    s = Scheduler(0.05)
    s.timer.start()
    try:
        batch = s.begin()
        wait_for(lambda: s.flushed)
        [(flushed, at)] = s.flushed
        assert flushed is batch
        assert at - batch.started >= 0.05
    finally:
        s.timer.stop()


def test_batches_that_keep_coming_do_not_wake_the_timer_each() -> None:
    """A sleeping timer is woken by the first batch; while more keep beginning within a
    period it looks on its own, once a period (each wake-up costs a GIL hand-over)."""
    s = Scheduler(0.2)
    s.timer.start()
    try:
        wait_for(lambda: s.timer._idle)
        for _ in range(40):
            s.begin()
            time.sleep(0.001)
            s.flush()
        assert s.flushed == []
        assert 1 <= s.wakes <= 3  # the first batch's (a stall of a whole period: more)
        # A period with no batch: the timer sleeps again, and the next batch wakes it.
        wait_for(lambda: s.timer._idle)
        before = s.wakes
        batch = s.begin()
        assert s.wakes == before + 1
        wait_for(lambda: s.flushed)
        assert s.flushed[0][0] is batch
    finally:
        s.timer.stop()


def test_a_batch_a_trace_records_waits_for_the_recordings_end() -> None:
    s = Scheduler(0.01)
    s.timer.start()
    try:
        batch = s.begin()
        batch.traced = True
        time.sleep(0.1)
        assert s.flushed == []  # overdue, but left to the recording
        batch.traced = False
        s.timer.wake()  # the recording's end
        wait_for(lambda: s.flushed)
        assert s.flushed[0][0] is batch
    finally:
        s.timer.stop()


def test_stop_ends_the_thread_and_flushes_nothing_more() -> None:
    s = Scheduler(0.05)
    s.timer.start()
    s.timer.start()  # a second start does nothing
    s.timer.stop()
    assert not any(t.name == "torch-flush" and t.is_alive() for t in [s.timer._thread])
    s.begin()
    time.sleep(0.1)
    assert s.flushed == []


def test_a_stop_that_comes_as_the_timer_goes_idle_is_not_lost() -> None:
    """stop() between the loop's look at ``_stopped`` and its sleep on the event: the
    look after going idle sees it (the thread had slept for good, close() 5 s)."""
    looks = 0
    stopper: list[threading.Thread] = []
    timer: FlushTimer

    def open_batch() -> FakeBatch:
        nonlocal looks
        looks += 1
        if looks == 1:  # past the loop's check: stop() comes now, and sets the event
            thread = threading.Thread(target=timer.stop)
            thread.start()
            stopper.append(thread)
            wait_for(timer._wake.is_set)
        return FakeBatch()

    timer = FlushTimer(0.002, open_batch, lambda batch: None)
    timer.start()
    wait_for(lambda: stopper)
    started = time.monotonic()
    stopper[0].join()
    assert time.monotonic() - started < 2
    assert timer._thread is not None and not timer._thread.is_alive()
