"""The deadline watchdog of an isolated engine whose parked worker gets a non-forced
Shutdown: that Shutdown ends the worker's Parks, so deadlines count again from its
sending (a job that then stalls is caught), and the Shutdown itself is timed as a
Drain is, by the requests it waits for.

Run as a module (``IsolationConfig(worker_module=WORKER)``), this file is a worker that
serves with the real ``WorkerHost`` on the CPU, as ``test_worker_shutdown_parked``'s
does: its engine's Park holds every job until its Shutdown ends it; then a job filling
with ``STALLS`` never ends, and any other takes ``RUN_S``.
"""

from __future__ import annotations

import asyncio
import math
import sys
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorSystem
from gpuactors.engine import Park, Shutdown, ShutdownReport
from gpuactors.engine.runtime import EngineConfig
from gpuactors.errors import EngineStopped
from gpuactors.worker import IsolatedEngine, IsolationConfig, JobResult
from gpuactors.worker.watchdog import DeadlineWatchdog
from worker_host_cases import ParkingEngine, serve_stand_in

pytestmark = pytest.mark.usefixtures("cpu_worker_importable")

WORKER = "test_worker_watchdog_after_shutdown"
STALLS = -1.0  # a job filling with this never ends once the Park is over
RUN_S = 1.0  # how long any other job runs once the Park is over
UNRESPONSIVE_S = 0.3
CONFIG = EngineConfig(default_task_timeout_s=0.2, hang_grace_ms=50.0)  # the parent's budgets


# --------------------------------------------------------------- the stand-in
class ParkedThenSlowEngine(ParkingEngine):
    """The worker's engine: a Park holds every job until the Shutdown ends it (as the
    real engine's drain does); then a job runs ``RUN_S``, or never ends (``STALLS``)."""

    async def run_job(self, args: tuple[Any, ...]) -> None:
        if args[1] == STALLS:
            await asyncio.Event().wait()  # never set: the job stalls
        await asyncio.sleep(RUN_S)
        await super().run_job(args)


# ------------------------------------------------------------------- the tests
async def parked_engine(system: ActorSystem) -> IsolatedEngine:
    isolation = IsolationConfig(
        worker_module=WORKER, standbys=0, start_timeout_s=30.0, unresponsive_s=UNRESPONSIVE_S
    )
    engine = await IsolatedEngine.start(system, config=CONFIG, isolation=isolation)
    await engine.ref.ask(Park())  # never resumed by the test
    return engine


def job(engine: IsolatedEngine, value: float, timeout: float) -> asyncio.Future[JobResult]:
    return asyncio.ensure_future(
        engine.run("fill", np.zeros(4, np.float32), value, n=4, timeout=timeout)
    )


async def test_a_job_that_stalls_after_a_parked_workers_shutdown_is_caught() -> None:
    """The job's deadline paused while the Park held it; once the Shutdown ended the
    Park, it counted again, and the stalled worker was declared stuck. The watchdog had
    stayed paused, so the Shutdown waited for good."""
    async with ActorSystem("watchdog-after-shutdown") as system:
        engine = await parked_engine(system)
        stalls = job(engine, STALLS, timeout=0.2)
        await asyncio.sleep(1.0)  # past the job's budget: parked, it is not late
        assert not stalls.done()

        report = await engine.shutdown(timeout=5.0)

        assert report == ShutdownReport(completed=0, cancelled=0)  # (the worker was lost)
        with pytest.raises(EngineStopped, match=r"did not answer Job .*\(stuck\)"):
            await asyncio.wait_for(stalls, 5)
        assert (await engine.health()).state == "stopped"


async def test_a_parked_workers_shutdown_is_timed_by_what_it_drains() -> None:
    """The job the Park held runs for a second after the Shutdown ends the Park, inside
    its own deadline (a timeout of 3 s) but past what the Shutdown's own budget would be
    (the default timeout, 0.2 s, plus the grace and ``unresponsive_s``): the Shutdown
    waits for it, as a Drain would."""
    async with ActorSystem("watchdog-shutdown-budget") as system:
        engine = await parked_engine(system)
        runs = job(engine, 2.0, timeout=3.0)
        await asyncio.sleep(0.1)

        report = await engine.shutdown(timeout=5.0)

        ran = await asyncio.wait_for(runs, 5)
        np.testing.assert_array_equal(ran.arrays[0], np.full(4, 2.0, np.float32))
        assert report == ShutdownReport(completed=1, cancelled=0)


def test_a_park_answered_after_the_shutdown_was_sent_holds_nothing() -> None:
    """The worker's engine takes no Park once its Shutdown has ended them all; a Park's
    answer that crossed the Shutdown on the way must not pause the deadlines again."""
    watchdog = DeadlineWatchdog(CONFIG, IsolationConfig(), list, lambda _reason: None)
    watchdog.park_answered(None)
    assert watchdog.parked
    watchdog.shutdown_sent()
    assert not watchdog.parked
    watchdog.park_answered(7)
    assert not watchdog.parked
    watchdog.new_worker()  # a new worker's Parks hold again
    watchdog.park_answered(None)
    assert watchdog.parked


def test_only_a_shutdown_that_drains_a_parked_worker_has_no_deadline_of_its_own() -> None:
    """A Shutdown after a Drain only closes the worker: one that wedges there is stuck."""
    watchdog = DeadlineWatchdog(CONFIG, IsolationConfig(), list, lambda _reason: None)
    assert watchdog.deadline_of(Shutdown()) < math.inf
    assert watchdog.deadline_of(Shutdown(force=True)) < math.inf
    watchdog.park_answered(None)
    watchdog.shutdown_sent()  # sent to the parked worker: it drains what the Park held
    assert watchdog.deadline_of(Shutdown()) == math.inf
    assert watchdog.deadline_of(Shutdown(force=True)) < math.inf


if __name__ == "__main__":
    asyncio.run(serve_stand_in(int(sys.argv[1]), ParkedThenSlowEngine()))
