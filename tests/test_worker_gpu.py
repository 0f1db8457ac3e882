"""Isolated engines on a real GPU: results, and recovery from faults and hangs.

The engine runs in worker processes; this process never touches their contexts,
so a fault poisons only the worker, which is replaced.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from gpu_scripts.fault_ops import BAD, SPIN
from gpuactors.actors import ActorSystem
from gpuactors.cuda import no_device_reason
from gpuactors.engine import (
    ArrayParam,
    Drain,
    Drained,
    EngineConfig,
    EnqueueBatch,
    OpSpec,
    ScalarParam,
)
from gpuactors.errors import (
    AskTimeout,
    CompileError,
    DeviceFailed,
    DeviceFault,
    GpuRefStale,
    InvalidArgument,
    TaskHung,
    UnknownOp,
)
from gpuactors.worker import IsolatedEngine, IsolationConfig, Job, JobResult

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(no_device_reason() is not None, reason=str(no_device_reason())),
]

SCALE = OpSpec(
    name="scale",
    params=(
        ArrayParam(name="y", dtype="float32", direction="out"),
        ArrayParam(name="x", dtype="float32"),
        ScalarParam(name="k", dtype="float32"),
    ),
    body="GPA_FOR_EACH(i) { y[i] = k * x[i]; }\nreturn 0;",
)


async def _standby_ready(engine: IsolatedEngine, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not (await engine.health()).standbys:
        assert time.monotonic() < deadline, "the standby worker never came up"
        await asyncio.sleep(0.05)


async def _axpy_jobs(
    engine: IsolatedEngine, count: int, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[asyncio.Task[JobResult]]]:
    expected, tasks = [], []
    for _ in range(count):
        x = rng.standard_normal(256).astype(np.float32)
        y = rng.standard_normal(256).astype(np.float32)
        a = np.float32(rng.standard_normal())
        expected.append(a * x + y)
        tasks.append(asyncio.create_task(engine.run("axpy", y, x, a, n=256, returns=(0,))))
        await asyncio.sleep(0)
    return expected, tasks


def _check(expected: list[np.ndarray], results: list[JobResult | BaseException]) -> None:
    for want, got in zip(expected, results, strict=True):
        assert isinstance(got, JobResult), got
        np.testing.assert_allclose(got.arrays[0], want, rtol=1e-6, atol=1e-6)


async def test_jobs_by_value_and_remote_arrays_match_numpy() -> None:
    rng = np.random.default_rng()
    async with ActorSystem("iso") as system:
        engine = await IsolatedEngine.start(
            system, ops=[SCALE], isolation=IsolationConfig(standbys=0)
        )
        x = rng.standard_normal(1000).astype(np.float32)
        poison = np.full(1000, np.nan, dtype=np.float32)
        result = await engine.run("scale", poison, x, 3.0, n=1000)
        np.testing.assert_allclose(result.arrays[0], 3.0 * x, rtol=1e-6)
        np.testing.assert_array_equal(result.arrays[1], x)  # inputs come back unless excluded
        assert result.completion.op == "scale" and result.generation == 1
        assert result.attempts == 1

        remote_x = await engine.upload(x)
        remote_y = await engine.upload(poison)
        await engine.run("scale", remote_y, remote_x, -2.0, n=1000)
        np.testing.assert_allclose(await engine.download(remote_y), -2.0 * x, rtol=1e-6)
        await engine.run("scale", remote_y[100:200], remote_x[0:100], 5.0, n=100)  # views
        expected = -2.0 * x
        expected[100:200] = 5.0 * x[:100]
        np.testing.assert_allclose(await engine.download(remote_y), expected, rtol=1e-6)
        offsets = np.arange(0, 1000, 10)  # a batch of 100 tasks over the same bases
        batch = await engine.ref.ask(
            EnqueueBatch(
                op="scale",
                args=(remote_y, remote_x, 0.5),
                n=10,
                offsets={"y": offsets, "x": offsets},
            )
        )
        assert batch.count == 100 and batch.failed == 0
        np.testing.assert_allclose(await engine.download(remote_y), 0.5 * x, rtol=1e-6)
        with pytest.raises(InvalidArgument, match="RemoteArray"):
            await engine.ref.ask(EnqueueBatch(op="scale", args=(poison, x, 1.0), n=1, count=1))
        await engine.free(remote_y)
        with pytest.raises(GpuRefStale):
            await engine.download(remote_y)
        with pytest.raises(UnknownOp):
            await engine.run("no_such_op", poison, n=4)
        hostile = [  # each is refused in the worker before it reaches the ring
            (("scale", poison.astype(np.float64), x, 1.0), 1000),  # wrong dtype
            (("scale", poison[:10], x, 1.0), 1000),  # too small for n
            (("scale", poison, x), 1000),  # too few arguments
            (("scale", poison, x, "two"), 1000),  # not a number
        ]
        for args, n in hostile:
            with pytest.raises(InvalidArgument):
                await engine.run(*args, n=n)
        with pytest.raises(InvalidArgument):
            await engine.run("scale", poison, x, 1.0, n=-1)  # refused at the call site
        assert (await engine.health()).restarts == 0  # bad input is not a fault

        expected, tasks = await _axpy_jobs(engine, 500, rng)
        _check(expected, await asyncio.gather(*tasks, return_exceptions=True))
        stats = await engine.stats()
        assert stats.processed >= 502
        report = await engine.shutdown()
        assert report.cancelled == 0
        assert (await engine.health()).state == "stopped"


async def test_a_fault_fails_only_its_job_and_the_service_comes_back() -> None:
    rng = np.random.default_rng()
    async with ActorSystem("iso") as system:
        engine = await IsolatedEngine.start(system, ops=[BAD])
        await engine.install(SCALE)  # installed ops are replayed on the next worker
        before = await engine.upload(np.ones(16, np.float32))
        await _standby_ready(engine)
        first_pid = (await engine.health()).pid

        expected, tasks = await _axpy_jobs(engine, 150, rng)
        started = time.perf_counter()
        bad = asyncio.create_task(engine.run("bad_write", np.zeros(4, np.float32), n=4))
        more_expected, more_tasks = await _axpy_jobs(engine, 150, rng)
        with pytest.raises(DeviceFault, match="bad_write"):
            await bad
        results = await asyncio.gather(*tasks, *more_tasks, return_exceptions=True)
        recovered_after = time.perf_counter() - started
        _check(expected + more_expected, results)  # nothing accepted was lost

        health = await engine.health()
        assert health.state == "serving" and health.pid != first_pid
        assert health.restarts >= 1 and health.culprits == 1
        assert health.last_recovery_s is not None and health.last_recovery_s < 2.0
        assert recovered_after < 10.0
        with pytest.raises(GpuRefStale):
            await engine.run("scale", before, np.ones(16, np.float32), 1.0, n=16)
        x = rng.standard_normal(64).astype(np.float32)
        again = await engine.run("scale", np.zeros(64, np.float32), x, 0.5, n=64)
        np.testing.assert_allclose(again.arrays[0], 0.5 * x, rtol=1e-6)
        assert again.generation == health.generation
        await engine.shutdown()


async def test_a_hung_op_times_out_and_the_service_comes_back() -> None:
    rng = np.random.default_rng()
    config = EngineConfig(hang_grace_ms=300.0)
    async with ActorSystem("iso") as system:
        engine = await IsolatedEngine.start(system, ops=[SPIN], config=config)
        await _standby_ready(engine)
        hung = asyncio.create_task(
            engine.run("spin_forever", np.zeros(4, np.float32), n=4, timeout=0.05)
        )
        await asyncio.sleep(0.01)
        expected, tasks = await _axpy_jobs(engine, 100, rng)
        started = time.perf_counter()
        with pytest.raises(TaskHung, match="spin_forever"):
            await hung
        _check(expected, await asyncio.gather(*tasks, return_exceptions=True))
        assert time.perf_counter() - started < 5.0
        health = await engine.health()
        deadline = time.monotonic() + 30
        while health.restarts == 0:  # the worker reports its hang just after the TaskHung
            assert time.monotonic() < deadline, health
            await asyncio.sleep(0.01)
            health = await engine.health()
        assert health.state == "serving" and health.restarts == 1 and health.culprits == 1
        await engine.shutdown()


async def test_an_exhausted_restart_budget_fails_fast() -> None:
    isolation = IsolationConfig(max_restarts=1, standbys=0)
    async with ActorSystem("iso") as system:
        engine = await IsolatedEngine.start(system, ops=[BAD], isolation=isolation)
        for _ in range(2):
            with pytest.raises(DeviceFault):
                await engine.run("bad_write", np.zeros(4, np.float32), n=4)
        started = time.perf_counter()
        with pytest.raises(DeviceFailed, match="replacements"):
            await engine.run("fill", np.zeros(4, np.float32), 1.0, n=4)
        assert time.perf_counter() - started < 0.5
        health = await engine.health()
        assert health.state == "failed" and health.pid is None


INC = r"""
extern "C" __global__ void inc(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
"""
WILD = 'extern "C" __global__ void wild(float* x) { *(volatile float*)0x10 = x[0]; }\n'


async def test_kernels_compiled_and_launched_in_the_worker_survive_a_faulting_kernel() -> None:
    rng = np.random.default_rng()
    async with ActorSystem("iso") as system:
        engine = await IsolatedEngine.start(system)
        await _standby_ready(engine)
        inc = await engine.compile(INC, "inc")
        wild = await engine.compile(WILD, "wild")
        x = rng.standard_normal(1000).astype(np.float32)
        result = await engine.launch(inc, 4, 256, x, np.int32(1000))
        np.testing.assert_allclose(result.arrays[0], x + 1.0, rtol=1e-6)
        remote = await engine.upload(x)
        await engine.launch(inc, 4, 256, remote, np.int32(1000))
        np.testing.assert_allclose(await engine.download(remote), x + 1.0, rtol=1e-6)
        with pytest.raises(InvalidArgument):  # a Python int: its C type would be a guess
            await engine.launch(inc, 4, 256, x, 1000)

        with pytest.raises(DeviceFault, match="LaunchJob"):
            await engine.launch(wild, 1, 1, x)
        with pytest.raises(GpuRefStale, match="remote kernel"):
            await engine.launch(inc, 4, 256, x, np.int32(1000))
        inc = await engine.compile(INC, "inc")  # a cache hit in the new worker
        again = await engine.launch(inc, 4, 256, x, np.int32(1000))
        np.testing.assert_allclose(again.arrays[0], x + 1.0, rtol=1e-6)
        health = await engine.health()
        assert health.restarts == 1 and health.culprits == 1 and again.generation == 2
        await engine.shutdown()


async def test_values_cross_the_real_workers_protocol_intact() -> None:
    """The worker protocol (JSON + raw buffers) with the real worker: large, strided,
    multi-dimensional and 0-d arrays, errors with their details, engine replies."""
    rng = np.random.default_rng()
    async with ActorSystem("iso") as system:
        engine = await IsolatedEngine.start(
            system, ops=[SCALE], isolation=IsolationConfig(standbys=0)
        )
        n = 1 << 22  # 16 MiB each way, by value
        x = rng.standard_normal(2 * n).astype(np.float32)[::2]  # strided: sent contiguous
        result = await engine.run("scale", np.empty(n, np.float32), x, np.float32(0.5), n=n)
        np.testing.assert_allclose(result.arrays[0], 0.5 * x, rtol=1e-6)
        assert result.arrays[0].flags.writeable  # the caller owns what comes back
        for array in (
            rng.standard_normal((3, 5, 7)),
            np.array(2.5, np.float32),
            np.eye(3, dtype=bool),
        ):
            remote = await engine.upload(array)
            back = await engine.download(remote)
            assert back.dtype == array.dtype and back.shape == array.shape
            np.testing.assert_array_equal(back, array)
        with pytest.raises(CompileError) as compile_error:
            await engine.compile('extern "C" __global__ void k(float* x) { oops; }', "k")
        assert "oops" in compile_error.value.log  # the error's details crossed too
        stats = await engine.stats()
        assert stats.processed >= 1 and "scale@1" in stats.ops
        assert (await engine.health()).restarts == 0
        await engine.shutdown()


NAP = OpSpec(  # holds its block for ``ms`` milliseconds of the device's clock
    name="nap",
    params=(
        ArrayParam(name="y", dtype="float32", direction="out"),
        ScalarParam(name="ms", dtype="float32"),
    ),
    body=(
        "unsigned long long start, now;\n"
        'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));\n'
        'do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); }\n'
        "while (now - start < (unsigned long long)(ms * 1e6f));\n"
        "GPA_FOR_EACH(i) { y[i] = ms; }\nreturn 0;"
    ),
)


async def test_a_drain_waits_for_a_job_whose_caller_left() -> None:
    """Drain's promise (every task accepted so far, its caller waiting or not) holds in
    an isolated engine: it had waited only for the callers still waiting."""
    async with ActorSystem("iso") as system:
        engine = await IsolatedEngine.start(
            system, ops=[NAP], isolation=IsolationConfig(standbys=0)
        )
        await engine.run("nap", np.zeros(4, np.float32), 1.0, n=4)  # warm
        before = (await engine.ref.ask(Drain(), expect=Drained)).processed
        job = Job(op="nap", args=(np.zeros(4, np.float32), 400.0), n=4)
        with pytest.raises(AskTimeout):
            await engine.ref.ask(job, timeout=0.1)
        started = time.perf_counter()
        drained = await engine.ref.ask(Drain(), timeout=30, expect=Drained)
        assert time.perf_counter() - started > 0.2
        assert drained.processed == before + 1
        await engine.shutdown()
