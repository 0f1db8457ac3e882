"""IsolatedEngineActor's supervision logic, driven by a CPU stand-in worker process.

``cpu_worker.py`` speaks the real protocol and fails on cue (fault, hang, crash,
stall), so triage, re-runs, standby promotion, replay and restart budgets are
tested here without a GPU. ``test_worker_gpu.py`` runs the same cases for real.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import pytest

from gpuactors.actors import ActorSystem
from gpuactors.engine import ArrayParam, EngineConfig, EnqueueBatch, OpSpec
from gpuactors.errors import (
    AskTimeout,
    DeviceFailed,
    DeviceFault,
    EngineStopped,
    GpuRefStale,
    InvalidArgument,
    TaskHung,
    UnknownOp,
)
from gpuactors.worker import IsolatedEngine, IsolationConfig, Job, JobResult, WorkerHealth

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("cpu_worker_importable")]


def cpu_isolation(**changes: object) -> IsolationConfig:
    return IsolationConfig(worker_module="cpu_worker", start_timeout_s=30.0, **changes)  # type: ignore[arg-type]


async def standbys_ready(engine: IsolatedEngine, count: int = 1) -> None:
    deadline = time.monotonic() + 30
    while (await engine.health()).standbys < count:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


async def restarts_reach(engine: IsolatedEngine, restarts: int) -> WorkerHealth:
    deadline = time.monotonic() + 30
    health = await engine.health()
    while health.restarts < restarts:  # a worker reports its hang just after the TaskHung
        assert time.monotonic() < deadline, health
        await asyncio.sleep(0.01)
        health = await engine.health()
    return health


async def axpy_jobs(
    engine: IsolatedEngine, count: int
) -> tuple[list[np.ndarray], list[asyncio.Task[JobResult]]]:
    rng = np.random.default_rng()
    expected, tasks = [], []
    for _ in range(count):
        x = rng.standard_normal(8).astype(np.float32)
        y = rng.standard_normal(8).astype(np.float32)
        expected.append(np.float32(2.0) * x + y)
        tasks.append(asyncio.create_task(engine.run("axpy", y, x, 2.0, n=8, returns=(0,))))
    await asyncio.sleep(0)
    return expected, tasks


async def all_correct(expected: list[np.ndarray], tasks: list[asyncio.Task[JobResult]]) -> None:
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for want, got in zip(expected, results, strict=True):
        assert isinstance(got, JobResult), got
        np.testing.assert_allclose(got.arrays[0], want, rtol=1e-6)


async def test_results_and_a_clean_shutdown() -> None:
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(system, isolation=cpu_isolation())
        expected, tasks = await axpy_jobs(engine, 50)
        await all_correct(expected, tasks)
        with pytest.raises(UnknownOp):
            await engine.run("nope", np.zeros(2, np.float32), n=2)
        await engine.shutdown()
        await asyncio.sleep(0.2)  # the worker's exit must not look like a fault
        health = await engine.health()
        assert health.state == "stopped" and health.restarts == 0


@pytest.mark.parametrize("op", ["crash", "bad_write"])
async def test_a_worker_lost_during_shutdown_answers_its_jobs_and_the_shutdown(op: str) -> None:
    """No worker replaces it while shutting down: what it held fails, clearly."""
    bad = OpSpec(name="bad_write", params=(ArrayParam(name="out", dtype="float32"),), body="")
    async with ActorSystem("sup-lost") as system:
        engine = await IsolatedEngine.start(system, ops=[bad], isolation=cpu_isolation())
        job = asyncio.ensure_future(engine.run(op, np.zeros(4, np.float32), n=4))
        await asyncio.sleep(0)  # accepted and sent to the worker
        shutdown = asyncio.ensure_future(engine.shutdown(timeout=None))
        with pytest.raises((EngineStopped, DeviceFault)):
            await asyncio.wait_for(job, 15)
        await asyncio.wait_for(shutdown, 15)
        assert (await engine.health()).state == "stopped"


@pytest.mark.parametrize("standbys", [0, 1, 2])
async def test_a_fault_fails_only_the_culprit(standbys: int) -> None:
    bad = OpSpec(name="bad_write", params=(ArrayParam(name="out", dtype="float32"),), body="")
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(
            system, ops=[bad], isolation=cpu_isolation(standbys=standbys)
        )
        await standbys_ready(engine, standbys)
        remote = await engine.upload(np.ones(4, np.float32))
        before, tasks_before = await axpy_jobs(engine, 40)
        culprit = asyncio.create_task(engine.run("bad_write", np.zeros(4, np.float32), n=4))
        after, tasks_after = await axpy_jobs(engine, 40)
        with pytest.raises(DeviceFault, match="bad_write"):
            await culprit
        await all_correct(before + after, tasks_before + tasks_after)
        health = await engine.health()
        # The culprit is found by re-running suspects alone: it faults a second worker.
        assert health.culprits == 1 and health.restarts == 2 and health.generation == 3
        assert health.state == "serving" and health.last_recovery_s is not None
        with pytest.raises(GpuRefStale):
            await engine.download(remote)
        await engine.shutdown()


async def test_a_sole_job_that_crashes_its_worker_is_the_culprit() -> None:
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(system, isolation=cpu_isolation())
        with pytest.raises(DeviceFault, match="crash"):
            await engine.run("crash", np.zeros(4, np.float32), n=4)
        expected, tasks = await axpy_jobs(engine, 10)
        await all_correct(expected, tasks)
        assert (await engine.health()).restarts == 1


async def test_a_hang_names_its_culprit_and_the_rest_run_again() -> None:
    spin = OpSpec(name="spin_forever", params=(ArrayParam(name="out", dtype="float32"),), body="")
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(
            system, ops=[spin], isolation=cpu_isolation(), config=EngineConfig(hang_grace_ms=300)
        )
        await standbys_ready(engine)
        hung = asyncio.create_task(
            engine.run("spin_forever", np.zeros(4, np.float32), n=4, timeout=0.05)
        )
        slow = asyncio.create_task(engine.run("slow", np.zeros(4, np.float32), 7.0, n=4))
        await asyncio.sleep(0.01)
        expected, tasks = await axpy_jobs(engine, 30)
        with pytest.raises(TaskHung):
            await hung
        await all_correct(expected, tasks)
        assert np.all((await slow).arrays[0] == 7.0)  # in the hung worker: run again
        health = await restarts_reach(engine, 1)
        assert health.restarts == 1 and health.culprits == 1 and health.retried_jobs == 1


async def test_installed_ops_are_replayed_on_the_next_worker() -> None:
    extra = OpSpec(name="extra", params=(ArrayParam(name="out", dtype="float32"),), body="")
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(system, isolation=cpu_isolation())
        await engine.install(extra)
        for _ in range(2):
            with pytest.raises(DeviceFault):
                await engine.run("crash", np.zeros(4, np.float32), n=4)
        ops = (await engine.stats()).ops
        assert ops.count("extra") == 1, ops  # replayed once per worker, not accumulated


async def test_a_stalled_worker_is_replaced_by_the_watchdog() -> None:
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(system, isolation=cpu_isolation(unresponsive_s=0.2))
        started = time.perf_counter()
        with pytest.raises(DeviceFault, match="did not answer"):
            await engine.run("stall", np.zeros(4, np.float32), n=4, timeout=0.1)
        assert time.perf_counter() - started < 5
        expected, tasks = await axpy_jobs(engine, 5)
        await all_correct(expected, tasks)


async def test_an_exhausted_restart_budget_fails_every_request_at_once() -> None:
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(
            system, isolation=cpu_isolation(max_restarts=1, standbys=0)
        )
        for _ in range(2):
            with pytest.raises(DeviceFault):
                await engine.run("crash", np.zeros(4, np.float32), n=4)
        with pytest.raises(DeviceFailed, match="replacements"):
            await engine.run("fill", np.zeros(4, np.float32), 1.0, n=4)
        health = await engine.health()
        assert health.state == "failed" and health.pid is None


async def test_a_crash_outside_any_job_is_found_among_suspects() -> None:
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(system, isolation=cpu_isolation(standbys=2))
        await standbys_ready(engine, 2)
        slow = asyncio.create_task(engine.run("slow", np.zeros(4, np.float32), 2.0, n=4))
        await asyncio.sleep(0.05)
        with pytest.raises(DeviceFault, match="Upload"):
            await engine.upload(np.zeros(0, np.float32))  # crashes its worker
        assert np.all((await slow).arrays[0] == 2.0)  # a suspect, re-run alone: innocent
        # The culprit's caller hears of it before the second replacement is in place.
        health = await restarts_reach(engine, 2)
        assert health.culprits == 1 and health.restarts == 2 and health.state == "serving"


async def test_a_request_whose_asker_gave_up_before_it_was_sent_is_never_sent() -> None:
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(system, isolation=cpu_isolation(standbys=0))
        with pytest.raises(DeviceFault, match="Upload"):
            await engine.upload(np.zeros(0, np.float32))  # crashes its worker, alone: culprit
        # No spare: a request waits in the queue while the next worker boots.
        data = np.zeros(4, np.float32)
        with pytest.raises(AskTimeout):
            await engine.ref.ask(Job(op="fill", args=(data, 1.0), n=4), timeout=0.05)
        data[:] = 7.0  # the caller's array is its own again: the job must not read it now
        await restarts_reach(engine, 1)
        assert np.all((await engine.run("fill", data, 1.0, n=4)).arrays[0] == 1.0)
        assert (await engine.stats()).processed == 1  # that one only: the other never went


async def test_shutdown_answers_everything_and_refuses_what_comes_after() -> None:
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(system, isolation=cpu_isolation())
        expected, tasks = await axpy_jobs(engine, 20)
        report = await engine.shutdown()
        await all_correct(expected, tasks)  # accepted before Shutdown: all finished
        assert report.cancelled == 0
        with pytest.raises(EngineStopped):
            await engine.run("fill", np.zeros(2, np.float32), 1.0, n=2)
        assert (await engine.health()).state == "stopped"


async def test_a_message_that_cannot_be_sent_fails_alone() -> None:
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(system, isolation=cpu_isolation())
        expected, tasks = await axpy_jobs(engine, 5)
        unsendable = np.array([lambda: 0], dtype=object)
        with pytest.raises(InvalidArgument, match="cannot be sent"):
            await engine.run("fill", unsendable, 1.0, n=1)
        await all_correct(expected, tasks)
        assert (await engine.health()).restarts == 0


async def test_a_batch_on_host_arrays_is_refused_and_the_actor_keeps_serving() -> None:
    """The handler raises InvalidArgument: its asker gets it, and the actor is not
    restarted for it (the same worker, nothing failed)."""
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(system, isolation=cpu_isolation())
        before = await engine.health()
        batch = EnqueueBatch(op="fill", args=(np.zeros(2, np.float32), 1.0), n=2, count=1)
        with pytest.raises(InvalidArgument, match="RemoteArray bases and scalars"):
            await engine.ref.ask(batch)
        expected, tasks = await axpy_jobs(engine, 3)
        await all_correct(expected, tasks)
        after = await engine.health()
        assert after.state == "serving" and after.pid == before.pid and after.restarts == 0


async def test_remote_arrays_of_another_engine_instance_are_stale() -> None:
    async with ActorSystem("sup") as system:
        first = await IsolatedEngine.start(system, isolation=cpu_isolation(), name="a")
        second = await IsolatedEngine.start(system, isolation=cpu_isolation(), name="b")
        remote = await first.upload(np.ones(3, np.float32))
        with pytest.raises(GpuRefStale, match="another engine"):
            await second.download(remote)
        np.testing.assert_array_equal(await first.download(remote), np.ones(3))


async def test_remote_kernels_die_with_their_worker() -> None:
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(system, isolation=cpu_isolation())
        kernel = await engine.compile('extern "C" __global__ void k(float* x) {}', "k")
        result = await engine.launch(kernel, 1, 32, np.ones(4, np.float32))
        assert result.launched.name == "k" and result.generation == 1
        with pytest.raises(DeviceFault):
            await engine.run("crash", np.zeros(4, np.float32), n=4)
        with pytest.raises(GpuRefStale, match="remote kernel"):
            await engine.launch(kernel, 1, 32, np.ones(4, np.float32))
        again = await engine.compile('extern "C" __global__ void k(float* x) {}', "k")
        assert (await engine.launch(again, 1, 32)).generation == 2


def _live_children() -> set[int]:
    alive = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            alive.add(int(stat.parent.name))
    return alive


async def test_a_standby_that_dies_is_replaced_and_never_serves() -> None:
    async with ActorSystem("sup") as system:
        engine = await IsolatedEngine.start(system, isolation=cpu_isolation())
        await standbys_ready(engine)
        serving = (await engine.health()).pid
        (standby,) = _live_children() - {serving}
        os.kill(standby, 9)
        deadline = time.monotonic() + 30
        while True:  # dropped, then a new one booted
            health = await engine.health()
            spares = _live_children() - {serving}
            if health.standbys == 1 and spares and standby not in spares:
                break
            assert time.monotonic() < deadline, (health, spares)
            await asyncio.sleep(0.02)
        expected, tasks = await axpy_jobs(engine, 10)
        await all_correct(expected, tasks)
        health = await engine.health()
        assert health.pid == serving and health.restarts == 0
        await engine.shutdown()
        deadline = time.monotonic() + 10
        while _live_children():  # the serving worker exits, the spare is killed
            assert time.monotonic() < deadline, _live_children()
            await asyncio.sleep(0.02)
