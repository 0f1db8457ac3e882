"""Review fixes in gpuactors.worker: a fault, a Park and a shutdown do not wedge an
isolated engine, a drain's failure reaches its caller, spares are booted again with a
pause and a budget, and only jobs that really run again count as re-run.

The worker processes are CPU stand-ins: ``cpu_worker.py``, ``test_worker_review_s34``
run as a module (Parks), ``worker_stub_parks.py`` (its Shutdown ends every Park, as the
engine's does) and ``worker_stub_flaky.py`` (later boots fail, or die once booted).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorSystem
from gpuactors.engine import ArrayParam, OpSpec, Park, Resume
from gpuactors.errors import DeviceFailed, DeviceFault, EngineStopped, GpuRefStale
from gpuactors.worker import IsolatedEngine, IsolationConfig, Job, JobResult, RemoteArray
from gpuactors.worker import pool as pool_module
from gpuactors.worker.requests import PendingRequest, RequestBook

pytestmark = pytest.mark.usefixtures("cpu_worker_importable")

OWNER = "engine-instance"


def isolation(worker_module: str, **changes: Any) -> IsolationConfig:
    return IsolationConfig(worker_module=worker_module, start_timeout_s=30.0, **changes)


def fill(engine: IsolatedEngine) -> asyncio.Future[JobResult]:
    return asyncio.ensure_future(engine.run("fill", np.zeros(4, np.float32), 2.0, n=4))


def in_flight(book: RequestBook, message: Any, *, alone: bool = False) -> PendingRequest:
    """A request of ``message`` that the worker holds (its caller waits)."""
    request = book.new(message, asyncio.get_running_loop().create_future(), alone=alone)
    book.sent(request)
    return request


def job_on(array: RemoteArray | None = None) -> Job:
    return Job(op="fill", args=(array if array is not None else np.zeros(4, np.float32), 1.0), n=4)


# --------------------------------------------------------- a Park and a fault


async def test_a_resume_goes_beside_a_request_that_runs_alone() -> None:
    """A job re-run alone may wait for a Resume in a parked engine: the Resume passes."""
    book = RequestBook()
    in_flight(book, job_on(), alone=True)
    book.queue.append(book.new(Resume(), None))
    book.queue.append(book.new(job_on(), None))
    resume = book.next_to_send()
    assert resume is not None and isinstance(resume.message, Resume)
    book.sent(resume)
    assert book.next_to_send() is None  # anything else still waits its turn


async def test_a_park_held_at_a_fault_fails_and_is_not_re_run() -> None:
    book = RequestBook()
    park, job = in_flight(book, Park()), in_flight(book, job_on())
    outcome = book.triage("fault", hang=False, generation=1, owner=OWNER, max_attempts=3)
    assert park.future is not None and isinstance(park.future.exception(), DeviceFault)
    assert [r.message for r in book.queue] == [job.message]  # re-run alone: the
    assert book.queue[0].alone and outcome.culprits == 0  # Park may have been the culprit


async def test_after_a_hang_a_park_is_re_run_as_usual() -> None:
    book = RequestBook()
    park, _job = in_flight(book, Park()), in_flight(book, job_on())
    book.triage("hang", hang=True, generation=1, owner=OWNER, max_attempts=3)
    assert park in book.queue and not park.alone


async def test_a_park_re_run_after_a_fault_no_longer_deadlocks_the_engine() -> None:
    """The reviewer's case end to end: a culprit, a Park and a job in one worker."""
    async with ActorSystem("alone-park") as system:
        engine = await IsolatedEngine.start(
            system, isolation=isolation("test_worker_review_s34", standbys=2)
        )
        culprit = asyncio.ensure_future(engine.run("bad_write", np.zeros(4, np.float32), n=4))
        park = asyncio.ensure_future(engine.ref.ask(Park()))
        job = fill(engine)
        with pytest.raises(DeviceFault, match="faulted worker"):
            await asyncio.wait_for(culprit, 15.0)
        with pytest.raises(DeviceFault, match="starts unparked"):
            await asyncio.wait_for(park, 15.0)
        assert isinstance(await asyncio.wait_for(job, 15.0), JobResult)
        await engine.ref.ask(Resume(), timeout=5.0)  # (a Resume that ends nothing)
        await engine.shutdown(timeout=10.0)


# ------------------------------------------------- stale suspects, re-run count


async def test_stale_suspects_fail_in_triage_and_are_not_counted_as_re_run() -> None:
    book = RequestBook()
    remote = RemoteArray(id=1, shape=(4,), dtype="float32", generation=1, owner=OWNER)
    stale = [in_flight(book, job_on(remote)) for _ in range(2)]
    culprit = in_flight(book, job_on())
    outcome = book.triage("fault", hang=False, generation=1, owner=OWNER, max_attempts=3)
    for request in stale:
        assert request.future is not None and isinstance(request.future.exception(), GpuRefStale)
    assert outcome.retried_jobs == 1 and list(book.queue) == [culprit]
    assert culprit.alone  # a stale job may have been the culprit: this one is not proven


async def test_a_stale_request_alone_at_a_fault_is_its_culprit() -> None:
    """A kernel launch on a RemoteArray that faults its worker: the error says what
    faulted it (the request's remote array died with that worker, too)."""
    book = RequestBook()
    remote = RemoteArray(id=1, shape=(4,), dtype="float32", generation=1, owner=OWNER)
    culprit = in_flight(book, job_on(remote))
    outcome = book.triage("fault", hang=False, generation=1, owner=OWNER, max_attempts=3)
    assert culprit.future is not None
    assert isinstance(culprit.future.exception(), DeviceFault)
    assert outcome.culprits == 1 and not book.queue


# --------------------------------------------------------- shutdown and drain


@pytest.mark.parametrize("force", [False, True])
async def test_shutdown_of_a_parked_worker_ends(force: bool) -> None:
    async with ActorSystem("parked-shutdown") as system:
        engine = await IsolatedEngine.start(
            system, isolation=isolation("worker_stub_parks", standbys=0)
        )
        await engine.ref.ask(Park())
        job = fill(engine)
        await asyncio.sleep(0.1)  # sent: it waits in the parked worker
        report = await engine.shutdown(force=force, timeout=5.0)
        outcome = (await asyncio.gather(asyncio.wait_for(job, 5.0), return_exceptions=True))[0]
        if force:  # (a forced one may cancel it: the stand-in runs it)
            assert isinstance(outcome, JobResult | EngineStopped), outcome
        else:  # it drains what was accepted
            assert isinstance(outcome, JobResult) and report.completed == 1, outcome
        assert (await engine.health()).state == "stopped"


async def test_a_forced_shutdown_does_not_wait_for_what_the_worker_runs() -> None:
    async with ActorSystem("forced") as system:
        engine = await IsolatedEngine.start(system, isolation=isolation("cpu_worker", standbys=0))
        stalled = asyncio.ensure_future(engine.run("stall", np.zeros(4, np.float32), n=4))
        await asyncio.sleep(0.1)
        await engine.shutdown(force=True, timeout=5.0)
        with pytest.raises(EngineStopped):
            await asyncio.wait_for(stalled, 5.0)


async def test_drain_passes_a_failure_on_and_makes_up_no_count() -> None:
    async with ActorSystem("drain-failure") as system:
        engine = await IsolatedEngine.start(
            system, isolation=isolation("cpu_worker", standbys=0, max_restarts=0)
        )
        with pytest.raises(DeviceFault):
            await engine.run("crash", np.zeros(4, np.float32), n=4)
        with pytest.raises(DeviceFailed):  # was Drained(processed=0)
            await engine.drain(timeout=5.0)
    async with ActorSystem("drain-stopped") as system:
        engine = await IsolatedEngine.start(system, isolation=isolation("cpu_worker", standbys=0))
        await engine.shutdown()
        with pytest.raises(EngineStopped):
            await engine.drain(timeout=5.0)


# ------------------------------------------------------------------- spares


def flaky(mode: str, counter: Path) -> OpSpec:
    params = (ArrayParam(name="out", dtype="float32"),)
    return OpSpec(name="flaky_boots", params=params, body=f"{mode}:{counter}")


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "_STANDBY_RETRY_S", 0.01)


@pytest.mark.usefixtures("quick_retries")
async def test_a_spare_whose_boot_failed_is_booted_again(tmp_path: Path) -> None:
    counter = tmp_path / "boots"
    async with ActorSystem("flaky-spare") as system:
        engine = await IsolatedEngine.start(
            system,
            ops=[flaky("fail_second", counter)],
            isolation=isolation("worker_stub_flaky", standbys=1),
        )
        deadline = time.monotonic() + 10.0
        while (await engine.health()).standbys < 1:
            assert time.monotonic() < deadline, f"no spare after {counter.read_text()} boots"
            await asyncio.sleep(0.02)
        assert counter.read_text() == "3"  # the server, the failed spare, its retry
        await engine.shutdown()


@pytest.mark.usefixtures("quick_retries")
async def test_spares_that_keep_dying_stop_being_booted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    counter = tmp_path / "boots"
    budget = isolation("worker_stub_flaky", standbys=1, max_restarts=1)
    async with ActorSystem("dying-spare") as system:
        engine = await IsolatedEngine.start(
            system, ops=[flaky("die_after_ready", counter)], isolation=budget
        )
        deadline = time.monotonic() + 10.0
        while "standby workers keep failing" not in caplog.text:
            assert time.monotonic() < deadline, f"{counter.read_text()} boots"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        assert counter.read_text() == "3"  # the server, then max_restarts + 1 spares
        assert (await engine.health()).standbys == 0
        assert isinstance(await asyncio.wait_for(fill(engine), 5.0), JobResult)  # it serves
        await engine.shutdown()
