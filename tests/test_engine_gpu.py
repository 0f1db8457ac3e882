"""The persistent engine on a real GPU: correctness, parking, modes, drain and shutdown."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorSystem
from gpuactors.cuda import no_device_reason
from gpuactors.engine import (
    ArrayParam,
    Engine,
    EngineConfig,
    Enqueue,
    OpSpec,
    PersistentThreadMode,
    ScalarParam,
)
from gpuactors.errors import (
    EngineStopped,
    InvalidArgument,
    TaskFailed,
    TaskTimeout,
    UnknownOp,
    WrongDevice,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(no_device_reason() is not None, reason=str(no_device_reason())),
]

SCALE64 = OpSpec(
    name="scale64",
    params=(
        ArrayParam(name="y", dtype="float64", direction="out"),
        ArrayParam(name="x", dtype="float64"),
        ScalarParam(name="k", dtype="float64"),
    ),
    body="GPA_FOR_EACH(i) { y[i] = k * x[i]; }\nreturn 0;",
)
FAIL_IF_NEG = OpSpec(
    name="fail_if_negative",
    params=(ScalarParam(name="v", dtype="int32"),),
    body="return v < 0 ? 42 : 0;",
)
USER_OPS = (SCALE64, FAIL_IF_NEG)


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    async with ActorSystem("gpu-test") as system:
        engine = await Engine.start(system, ops=USER_OPS, config=EngineConfig(idle_park_ms=5.0))
        yield engine
        await engine.shutdown(timeout=30)


def _rng() -> np.random.Generator:
    return np.random.default_rng(int(time.time_ns() % 2**32))


async def _check_all_ops(engine: Engine) -> dict[str, Any]:
    """Run every built-in op and the user ops on fresh random data; compare with NumPy."""
    import cupy as cp

    rng = _rng()
    n = int(rng.integers(5000, 50_000))  # the small sizes below go up to 4096
    x_h = rng.standard_normal(n).astype(np.float32)
    y_h = rng.standard_normal(n).astype(np.float32)
    x, y = cp.asarray(x_h), cp.asarray(y_h)
    out = cp.full(n, np.nan, dtype=cp.float32)
    results: dict[str, Any] = {}

    await engine.enqueue("fill", out, 2.5, n=n, blocks=4)
    results["fill"] = cp.asnumpy(out)
    np.testing.assert_array_equal(results["fill"], np.full(n, 2.5, np.float32))

    out.fill(np.nan)
    await engine.enqueue("copy", out, x, n=n, blocks=3)
    results["copy"] = cp.asnumpy(out)
    np.testing.assert_array_equal(results["copy"], x_h)

    await engine.enqueue("axpy", y, x, 1.5, n=n, blocks=2)
    results["axpy"] = cp.asnumpy(y)
    np.testing.assert_allclose(results["axpy"], 1.5 * x_h + y_h, rtol=1e-5, atol=1e-6)  # FMA

    total = cp.full(1, np.nan, dtype=cp.float32)
    await engine.enqueue("sum", total, x, n=n)
    results["sum"] = float(total[0])
    assert results["sum"] == pytest.approx(float(x_h.astype(np.float64).sum()), rel=1e-4, abs=1e-2)

    data_h = rng.integers(0, 256, n * 4, dtype=np.uint8)
    hist = cp.zeros(256, dtype=cp.uint32)
    await engine.enqueue("byte_hist", hist, cp.asarray(data_h), n=n * 4, blocks=5)
    results["byte_hist"] = cp.asnumpy(hist)
    np.testing.assert_array_equal(results["byte_hist"], np.bincount(data_h, minlength=256))

    # Small tasks (run by the dispatcher's block when alone), at sizes that do and do
    # not fill the four-elements-a-thread loops of copy, axpy and sum.
    for small in (1, 3, 255, 257, 1023, 1024, 1029, 4096):
        xs_h, ys_h = x_h[:small], y_h[:small]
        out.fill(np.nan)
        await engine.enqueue("copy", out, x, n=small)
        np.testing.assert_array_equal(cp.asnumpy(out[:small]), xs_h)
        assert bool(cp.isnan(out[small:]).all()), "copy wrote past n"
        ys = cp.asarray(ys_h)
        await engine.enqueue("axpy", ys, x, -0.5, n=small)
        np.testing.assert_allclose(cp.asnumpy(ys), -0.5 * xs_h + ys_h, rtol=1e-5, atol=1e-6)
        await engine.enqueue("sum", total, x, n=small)
        expected = float(xs_h.astype(np.float64).sum())
        assert float(total[0]) == pytest.approx(expected, rel=1e-4, abs=1e-3), small

    x64 = rng.standard_normal(n)
    y64 = cp.full(n, np.nan)
    await engine.enqueue("scale64", y64, cp.asarray(x64), -3.25, n=n)
    results["scale64"] = cp.asnumpy(y64)
    np.testing.assert_allclose(results["scale64"], -3.25 * x64)
    return results


async def test_every_op_matches_numpy(engine: Engine) -> None:
    await _check_all_ops(engine)
    stats = await engine.stats()
    assert stats.processed == 6 + 8 * 3 and stats.failed == 0


async def test_op_failure_code_becomes_task_failed(engine: Engine) -> None:
    with pytest.raises(TaskFailed) as info:
        await engine.enqueue("fail_if_negative", -1, n=1)
    assert info.value.code == 42 and info.value.op == "fail_if_negative"
    done = await engine.enqueue("fail_if_negative", 1, n=1)
    assert done.status == 0


class HostDlpack:
    """A host array seen only through DLPack (as a CPU torch tensor is)."""

    def __init__(self, n: int) -> None:
        self._array = np.zeros(n, dtype=np.float32)

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._array.__dlpack_device__()


async def test_bad_arguments_are_refused_before_the_ring(engine: Engine) -> None:
    import cupy as cp

    x = cp.zeros(100, dtype=cp.float32)
    misaligned = cp.ndarray((99,), cp.float32, memptr=x.data + 2)  # (CuPy makes any view)
    cases: list[tuple[type[Exception], Enqueue]] = [
        (UnknownOp, Enqueue(op="nope", args=(), n=1)),
        (InvalidArgument, Enqueue(op="fill", args=(x,), n=100)),  # arity
        (InvalidArgument, Enqueue(op="fill", args=(x.astype(cp.float64), 1.0), n=100)),  # dtype
        (InvalidArgument, Enqueue(op="fill", args=(x, 1.0), n=101)),  # too small
        (InvalidArgument, Enqueue(op="fill", args=(np.zeros(100, np.float32), 1.0), n=10)),  # host
        (InvalidArgument, Enqueue(op="fill", args=(x[::2], 1.0), n=10)),  # not contiguous
        (InvalidArgument, Enqueue(op="fill", args=(x, float("nan")), n=10)),  # NaN scalar
        (InvalidArgument, Enqueue(op="fill", args=(x, "1.0"), n=10)),  # wrong scalar type
        (InvalidArgument, Enqueue(op="sum", args=(x, x), n=10, blocks=2)),  # single-block op
        (InvalidArgument, Enqueue(op="fail_if_negative", args=(2**40,), n=1)),  # int32 range
        (InvalidArgument, Enqueue(op="fail_if_negative", args=(np.int64(2**40),), n=1)),
        (InvalidArgument, Enqueue(op="fill", args=(HostDlpack(100), 1.0), n=10)),  # host DLPack
        (InvalidArgument, Enqueue(op="fill", args=(misaligned, 1.0), n=10)),  # a device fault
    ]
    for error, message in cases:
        with pytest.raises(error):
            await engine.ref.ask(message, timeout=10)
    stats = await engine.stats()
    assert stats.in_flight == 0 and stats.queue_depth == 0
    with pytest.raises(InvalidArgument, match="not a multiple of its 4-byte elements"):
        await engine.enqueue("fill", misaligned, 1.0, n=10)
    await engine.enqueue("fill", x, 7.0, n=100)  # the engine still serves
    assert bool((x == 7.0).all())
    if cp.cuda.runtime.getDeviceCount() > 1:  # pragma: no cover - multi-GPU hosts only
        with cp.cuda.Device(1):
            other = cp.zeros(100, dtype=cp.float32)
        with pytest.raises(WrongDevice):
            await engine.enqueue("fill", other, 1.0, n=100)


async def test_many_concurrent_clients_checksum(engine: Engine) -> None:
    """100 clients x 2,000 single-element axpy tasks: every increment lands exactly once."""
    await _increments(engine, clients=100, per_client=2_000)


async def _increments(engine: Engine, clients: int, per_client: int) -> float:
    """Each client adds 1 to its own counter `per_client` times, one ask per add; every
    increment must land exactly once. Returns the seconds it took."""
    import cupy as cp

    acc = cp.zeros(clients, dtype=cp.float32)
    one = cp.ones(1, dtype=cp.float32)
    cp.cuda.get_current_stream().synchronize()

    async def client(k: int) -> None:
        target = acc[k : k + 1]
        for _ in range(per_client):
            await engine.ref.ask(Enqueue(op="axpy", args=(target, one, 1.0), n=1, after="none"))

    started = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(clients)))
    elapsed = time.perf_counter() - started
    np.testing.assert_array_equal(cp.asnumpy(acc), np.full(clients, per_client, np.float32))
    return elapsed


async def test_many_concurrent_enqueue_callers_checksum(engine: Engine) -> None:
    """1,000 callers of Engine.enqueue (submitted together, one Submit per loop turn)
    with the default ``after``: every increment lands exactly once."""
    import cupy as cp

    clients, per_client = 1000, 50
    acc = cp.zeros(clients, dtype=cp.float32)
    one = cp.ones(1, dtype=cp.float32)
    cp.cuda.get_current_stream().synchronize()

    async def client(k: int) -> None:
        target = acc[k : k + 1]
        for _ in range(per_client):
            done = await engine.enqueue("axpy", target, one, 1.0, n=1)
            assert done.status == 0 and done.op == "axpy"

    await asyncio.gather(*(client(k) for k in range(clients)))
    np.testing.assert_array_equal(cp.asnumpy(acc), np.full(clients, per_client, np.float32))


async def test_enqueue_waits_for_the_stream_current_at_the_call(engine: Engine) -> None:
    """The stream that counts is CuPy's current stream when enqueue is called, even
    when the task is handed over later: the input written on it is read complete."""
    import cupy as cp

    spin = cp.RawKernel(SPIN_SOURCE, "gpa_test_spin")
    stream = cp.cuda.Stream(non_blocking=True)
    n = 1 << 16
    x = cp.zeros(n, dtype=cp.float32)
    y = cp.zeros(n, dtype=cp.float32)
    async with engine.parked():  # the module loads while no engine kernel runs
        spin((1,), (1,), (np.uint64(0),), stream=stream)
        stream.synchronize()
    busy = asyncio.ensure_future(engine.enqueue("fill", y, 5.0, n=n, after="none"))
    with stream:  # x is written only after 50 ms of spinning on this stream
        spin((1,), (1,), (np.uint64(50_000_000),))
        x.fill(3.0)
        copied = asyncio.ensure_future(engine.enqueue("copy", y, x, n=n))
        await asyncio.sleep(0)  # both calls start here, this stream current
    await asyncio.wait_for(asyncio.gather(busy, copied), 30)
    assert bool((y == 3.0).all()), "the copy ran after the stream's write"


async def test_idle_park_and_relaunch(engine: Engine) -> None:
    import cupy as cp

    x = cp.zeros(10, dtype=cp.float32)
    await engine.enqueue("fill", x, 1.0, n=10)
    await asyncio.sleep(0.1)  # idle_park_ms=5: the kernel has parked by itself
    before = await engine.stats()
    assert before.park_reasons.get("idle", 0) >= 1
    await engine.enqueue("fill", x, 2.0, n=10)
    after = await engine.stats()
    assert after.launches == before.launches + 1
    assert bool((x == 2.0).all())


SPIN_SOURCE = r"""
extern "C" __global__ void gpa_test_spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""


async def test_a_task_waiting_for_its_inputs_past_its_deadline_times_out(engine: Engine) -> None:
    """``after="current_stream"`` holds the task on the host while the caller's stream
    is busy: its deadline holds there too, and the engine serves on afterwards."""
    import cupy as cp

    spin = cp.RawKernel(SPIN_SOURCE, "gpa_test_spin")
    stream = cp.cuda.Stream(non_blocking=True)
    x = cp.zeros(10, dtype=cp.float32)
    async with engine.parked():  # the module loads while no engine kernel runs
        spin((1,), (1,), (np.uint64(0),), stream=stream)
        stream.synchronize()
    with stream:
        spin((1,), (1,), (np.uint64(500_000_000),))  # the stream is busy for 0.5 s
        started = time.perf_counter()
        with pytest.raises(TaskTimeout, match="waited for its inputs"):
            await engine.ref.ask(Enqueue(op="fill", args=(x, 1.0), n=10, timeout=0.05))
        assert time.perf_counter() - started < 0.4
    stream.synchronize()
    assert bool((x == 0.0).all())  # the timed-out task never ran
    await engine.enqueue("fill", x, 2.0, n=10)
    assert bool((x == 2.0).all())


async def test_deadlines_are_kept_in_the_devices_time(engine: Engine) -> None:
    """The device compares deadlines with its own clock, which is not the host's (it
    was 0.7 ms behind on an H100, 0.2 ms ahead on an H200): a task that the device
    reaches 1 ms after a 20 us deadline times out and never runs."""
    import cupy as cp

    x = cp.zeros(10, dtype=cp.float32)
    async with engine.parked():  # published, not run
        late = asyncio.ensure_future(
            engine.ref.ask(Enqueue(op="fill", args=(x, 1.0), n=10, timeout=20e-6, after="none"))
        )
        await asyncio.sleep(0.001)
    with pytest.raises(TaskTimeout):
        await asyncio.wait_for(late, 10)
    assert bool((x == 0.0).all())  # its op never ran
    await engine.enqueue("fill", x, 2.0, n=10, timeout=0.05)  # a deadline ahead: it runs
    assert bool((x == 2.0).all())


async def test_a_relaunch_measures_the_clock_again_once_its_offset_is_old(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device's clock drifts from the host's by microseconds a second, so the offset
    deadlines are converted with is measured again once it is
    ``CLOCK_RECALIBRATE_SECONDS`` old: at a relaunch, or by a deadline converted while
    no kernel runs; the engine's deadlines follow it."""
    import cupy as cp

    from gpuactors.engine import runtime as runtime_module

    runtime = engine.ref._cell.instance._service.runtime
    service = engine.ref._cell.instance._service
    x = cp.zeros(10, dtype=cp.float32)
    await engine.enqueue("fill", x, 1.0, n=10)
    measured = runtime.clock_measured_at
    await asyncio.sleep(0.05)  # the kernel parks after 5 ms idle
    assert not runtime.running
    await engine.enqueue("fill", x, 2.0, n=10)  # a relaunch, the offset not yet old
    assert runtime.clock_measured_at == measured
    monkeypatch.setattr(runtime_module, "CLOCK_RECALIBRATE_SECONDS", 0.0)
    await asyncio.sleep(0.05)
    assert not runtime.running
    planted = runtime.clock_offset_ns + 10**6  # what the service must not keep
    service.adopt_clock_offset(planted)
    await engine.enqueue("fill", x, 3.0, n=10)  # relaunched: measured again
    assert runtime.clock_measured_at > measured
    assert service.clock_offset_ns == runtime.clock_offset_ns != planted
    monkeypatch.setattr(runtime_module, "CLOCK_RECALIBRATE_SECONDS", 5.0)
    await asyncio.sleep(0.05)
    assert not runtime.running
    runtime.clock_measured_at = 0.0  # old: a deadline converted now measures it first
    service.offset_fresh_until_ns = 0
    service.deadline_ns(1.0)
    assert runtime.clock_measured_at > measured and service.offset_fresh_until_ns > 0
    await engine.enqueue("fill", x, 4.0, n=10, timeout=0.05)  # a deadline ahead: it runs
    assert bool((x == 4.0).all())


async def test_on_demand_park_holds_tasks_until_resume(engine: Engine) -> None:
    import cupy as cp

    x = cp.zeros(10, dtype=cp.float32)
    async with engine.parked():
        pending = asyncio.ensure_future(engine.enqueue("fill", x, 3.0, n=10))
        await asyncio.sleep(0.05)
        assert not pending.done(), "a parked engine must not run tasks"
        # A module load is safe while parked: a brand-new CuPy kernel loads and runs.
        cp.ElementwiseKernel("float32 a", "float32 b", "b = a + 1.5f", "gpa_test_parked")(x)
    await asyncio.wait_for(pending, 10)
    assert bool((x == 3.0).all())


async def test_foreign_cupy_module_load_while_engine_runs() -> None:
    """User code that loads a brand-new kernel while traffic flows must complete."""
    import cupy as cp

    config = EngineConfig(idle_park_ms=1000.0, max_residency_ms=50.0)
    async with ActorSystem("foreign-load") as system:
        engine = await Engine.start(system, config=config)
        acc = cp.zeros(1, dtype=cp.float32)
        one = cp.ones(1, dtype=cp.float32)
        stop = asyncio.Event()
        sent = 0

        async def traffic() -> None:
            nonlocal sent
            while not stop.is_set():
                await engine.enqueue("axpy", acc, one, 1.0, n=1)
                sent += 1

        flow = asyncio.ensure_future(traffic())
        await asyncio.sleep(0.05)
        outcome: dict[str, Any] = {}

        def load_new_kernel() -> None:
            kernel = cp.RawKernel(
                r'extern "C" __global__ void gpa_foreign(float* x) { x[0] = 42.0f; }', "gpa_foreign"
            )
            y = cp.zeros(1, dtype=cp.float32)
            with cp.cuda.Stream(non_blocking=True) as stream:
                kernel((1,), (1,), (y,))
                stream.synchronize()
            outcome["value"] = float(y[0])

        started = time.perf_counter()
        thread = threading.Thread(target=load_new_kernel, daemon=True)
        thread.start()
        await asyncio.to_thread(thread.join, 20)
        elapsed = time.perf_counter() - started
        stop.set()
        await flow
        assert not thread.is_alive(), "the foreign module load deadlocked with the engine"
        assert outcome["value"] == 42.0
        assert elapsed < 5.0
        await engine.drain(timeout=30)
        assert float(acc[0]) == sent
        await engine.shutdown(timeout=30)


async def test_drain_and_shutdown_lose_nothing() -> None:
    import cupy as cp

    async with ActorSystem("drain") as system:
        engine = await Engine.start(system, config=EngineConfig(capacity=64))
        count = 5_000
        acc = cp.zeros(count, dtype=cp.float32)
        one = cp.ones(1, dtype=cp.float32)
        cp.cuda.get_current_stream().synchronize()
        replies = [
            engine.ref.ask(Enqueue(op="axpy", args=(acc[k : k + 1], one, 1.0), n=1, after="none"))
            for k in range(count)
        ]  # far more than the ring holds: the rest waits in the backlog
        futures = [asyncio.ensure_future(r) for r in replies]
        await asyncio.sleep(0)
        drained = await engine.drain(timeout=60)
        assert drained.processed == count
        report = await engine.shutdown(timeout=60)
        assert report.cancelled == 0
        await asyncio.gather(*futures)
        np.testing.assert_array_equal(cp.asnumpy(acc), np.ones(count, np.float32))
        with pytest.raises(Exception):  # noqa: B017 - the actor is gone or refuses
            await engine.ref.ask(Enqueue(op="axpy", args=(acc, one, 1.0), n=1), timeout=5)


async def test_forced_shutdown_fails_queued_tasks_clearly() -> None:
    import cupy as cp

    async with ActorSystem("force") as system:
        engine = await Engine.start(system, config=EngineConfig(capacity=64))
        count = 200
        acc = cp.zeros(count, dtype=cp.float32)
        one = cp.ones(1, dtype=cp.float32)
        async with engine.parked():
            futures = [
                asyncio.ensure_future(engine.enqueue("axpy", acc[k : k + 1], one, 1.0, n=1))
                for k in range(count)
            ]
            await asyncio.sleep(0.05)
        report = await engine.shutdown(force=True, timeout=30)
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        stopped = {k for k, o in enumerate(outcomes) if isinstance(o, EngineStopped)}
        done = {k for k, o in enumerate(outcomes) if not isinstance(o, BaseException)}
        assert len(stopped) + len(done) == count
        assert report.cancelled == len(stopped)
        ran = set(np.flatnonzero(cp.asnumpy(acc)).tolist())
        assert ran == done, "every task reported done ran, and no cancelled task ran"


@pytest.mark.parametrize("mode", list(PersistentThreadMode))
async def test_all_modes_give_identical_results(mode: PersistentThreadMode) -> None:
    import cupy as cp

    rng = np.random.default_rng(7)
    x_h = rng.standard_normal(4096).astype(np.float32)
    async with ActorSystem(f"mode-{mode.value}") as system:
        engine = await Engine.start(system, config=EngineConfig(mode=mode))
        stats = await engine.stats()
        expected = "launch-per-batch" if mode is PersistentThreadMode.DISABLE else "persistent"
        assert stats.mode == expected
        x = cp.asarray(x_h)
        y = cp.zeros_like(x)
        total = cp.zeros(1, dtype=cp.float32)
        await engine.enqueue("axpy", y, x, 2.0, n=4096, blocks=4)
        await engine.enqueue("sum", total, y, n=4096)
        assert float(total[0]) == pytest.approx(float((2 * x_h.astype(np.float64)).sum()), abs=1e-2)
        np.testing.assert_allclose(cp.asnumpy(y), 2 * x_h, rtol=1e-6, atol=1e-6)
        await engine.shutdown(timeout=30)


WHICH_BLOCK = OpSpec(
    name="which_block",
    params=(ArrayParam(name="out", dtype="int32", direction="out"),),
    body="if (threadIdx.x == 0) out[0] = (int)blockIdx.x;\nreturn 0;",
)


@pytest.mark.parametrize("inline_max_n", [1 << 12, 0])
async def test_lone_tasks_run_alike_on_the_dispatcher_block(inline_max_n: int) -> None:
    """A lone one-block task runs on block 0 itself (n <= inline_max_n) or on a worker:
    the same results, failure codes and deadlines either way."""
    import cupy as cp

    rng = _rng()
    config = EngineConfig(inline_max_n=inline_max_n, idle_park_ms=50.0)
    async with ActorSystem(f"inline-{inline_max_n}") as system:
        engine = await Engine.start(system, ops=(*USER_OPS, WHICH_BLOCK), config=config)
        where = cp.full(1, -1, dtype=cp.int32)
        cp.cuda.get_current_stream().synchronize()
        for _ in range(3):  # one request at a time: block 0 when inlining, else a worker
            await engine.ref.ask(Enqueue(op="which_block", args=(where,), n=1, after="none"))
            assert (int(where[0]) == 0) == (inline_max_n > 0)
        for n in (1, 1000, 4096, 4097, 30_000):  # beyond 4096: the workers, even inlining
            x_h = rng.standard_normal(n).astype(np.float32)
            y_h = rng.standard_normal(n).astype(np.float32)
            x, y = cp.asarray(x_h), cp.asarray(y_h)
            total = cp.full(1, np.nan, dtype=cp.float32)
            cp.cuda.get_current_stream().synchronize()
            for _ in range(3):
                await engine.ref.ask(
                    Enqueue(op="axpy", args=(y, x, 0.5), n=n, after="none"), timeout=30
                )
            np.testing.assert_allclose(cp.asnumpy(y), y_h + 1.5 * x_h, rtol=1e-5, atol=1e-5)
            await engine.ref.ask(Enqueue(op="sum", args=(total, x), n=n, after="none"))
            expected = float(x_h.astype(np.float64).sum())
            assert float(total[0]) == pytest.approx(expected, rel=1e-4, abs=1e-2)
        with pytest.raises(TaskFailed) as info:
            await engine.enqueue("fail_if_negative", -1, n=1)
        assert info.value.code == 42
        async with engine.parked():  # its deadline passes while it waits: never run
            late = asyncio.ensure_future(
                engine.ref.ask(
                    Enqueue(op="fail_if_negative", args=(-1,), n=1, timeout=0.01, after="none")
                )
            )
            await asyncio.sleep(0.1)
        with pytest.raises(TaskTimeout):
            await late
        stats = await engine.stats()
        assert stats.processed == 3 + 5 * 4 and stats.failed == 2
        await engine.shutdown(timeout=30)


ECHO_WORDS = OpSpec(  # every scalar's bits and n, back out: the ring's wire form end to end
    name="echo_words",
    params=(
        ArrayParam(name="out", dtype="uint64", direction="out", length=10),
        *(ScalarParam(name=f"f{i}", dtype="float64") for i in range(3)),
        *(ScalarParam(name=f"i{i}", dtype="int64") for i in range(3)),
        *(ScalarParam(name=f"u{i}", dtype="uint64") for i in range(3)),
    ),
    body="""if (ctx.rank == 0 && threadIdx.x == 0) {
    out[0] = __double_as_longlong(f0); out[1] = __double_as_longlong(f1);
    out[2] = __double_as_longlong(f2); out[3] = i0; out[4] = i1; out[5] = i2;
    out[6] = u0; out[7] = u1; out[8] = u2; out[9] = n;
}
return 0;""",
)


@pytest.mark.parametrize("inline_max_n", [1 << 12, 0])
async def test_wide_values_cross_the_ring_intact(inline_max_n: int) -> None:
    """Arguments and counts whose top bytes are set travel in the ring's high-byte words;
    alone (the lone task's one-round-trip read), with a deadline, and in a batch (the
    general path), the op sees every bit."""
    import cupy as cp

    from gpuactors.engine import EnqueueBatch

    rng = _rng()
    config = EngineConfig(inline_max_n=inline_max_n, idle_park_ms=50.0)
    async with ActorSystem(f"wide-{inline_max_n}") as system:
        engine = await Engine.start(system, ops=(ECHO_WORDS,), config=config)
        out = cp.zeros(10, dtype=cp.uint64)
        cp.cuda.get_current_stream().synchronize()
        for round_ in range(20):
            floats = [float(v) for v in rng.standard_normal(3) * 10.0 ** rng.integers(-300, 300)]
            ints = [int(v) for v in rng.integers(-(2**63), 2**63 - 1, 3, dtype=np.int64)]
            uints = [int(v) for v in rng.integers(0, 2**64 - 1, 3, dtype=np.uint64)]
            n = int(rng.integers(0, 2**62)) if round_ % 2 else int(rng.integers(1, 4096))
            timeout = 30.0 if round_ % 3 == 0 else None
            await engine.ref.ask(
                Enqueue(
                    op="echo_words",
                    args=(out, *floats, *ints, *uints),
                    n=n,
                    timeout=timeout,
                    after="none",
                ),
                timeout=30,
            )
            expected = [*np.array(floats).view(np.uint64).tolist()]
            expected += [v % 2**64 for v in ints] + uints + [n]
            assert cp.asnumpy(out).tolist() == expected, round_
        count = 64
        outs = cp.zeros(10 * count, dtype=cp.uint64)
        f0 = rng.standard_normal(count) * 1e200
        u0 = rng.integers(2**56, 2**64 - 1, count, dtype=np.uint64)
        n = rng.integers(2**56, 2**62, count)
        reply = await engine.ref.ask(
            EnqueueBatch(
                op="echo_words",
                args=(outs, 1.0, -2.5, 3.0, -1, -(2**62), 5, 6, 2**63, 7),
                n=n,
                offsets={"out": np.arange(count) * 10},
                scalars={"f0": f0, "u0": u0},
                timeout=30.0,
            ),
            timeout=60,
        )
        assert reply.failed == 0
        got = cp.asnumpy(outs).reshape(count, 10)
        assert got[:, 0].tolist() == f0.view(np.uint64).tolist()
        assert got[:, 1].tolist() == [np.float64(-2.5).view(np.uint64)] * count
        assert got[:, 3].tolist() == [2**64 - 1] * count
        assert got[:, 4].tolist() == [2**64 - 2**62] * count
        assert got[:, 6].tolist() == u0.tolist() and got[:, 7].tolist() == [2**63] * count
        assert got[:, 9].tolist() == n.tolist()
        await engine.shutdown(timeout=30)


async def test_million_tasks_checksum() -> None:
    """1,000,000 tasks through the actor, 500 concurrent clients; checksum of every increment."""
    clients, per_client = 500, 2_000
    async with ActorSystem("million") as system:
        engine = await Engine.start(system, config=EngineConfig(capacity=4096))
        elapsed = await _increments(engine, clients, per_client)
        stats = await engine.stats()
        assert stats.processed == clients * per_client
        print(f"1,000,000 tasks in {elapsed:.2f} s ({clients * per_client / elapsed:,.0f} tasks/s)")
        await engine.shutdown(timeout=60)


@pytest.mark.parametrize("count", [1, 1_000, 100_000, 1_000_000])
async def test_enqueue_batch_sizes(engine: Engine, count: int) -> None:
    """One EnqueueBatch of `count` one-element fills, each writing its own index."""
    import cupy as cp

    from gpuactors.engine import EnqueueBatch

    out = cp.full(count, -1.0, dtype=cp.float32)
    index = np.arange(count)
    reply = await engine.ref.ask(
        EnqueueBatch(
            op="fill",
            args=(out, 0.0),
            n=1,
            offsets={"out": index},
            scalars={"value": index.astype(np.float32)},
        ),
        timeout=120,
    )
    assert reply.count == count and reply.failed == 0
    np.testing.assert_array_equal(cp.asnumpy(out), index.astype(np.float32))


async def test_enqueue_batch_multi_block_scan_jobs(engine: Engine) -> None:
    """Byte histograms of variable-size jobs, some spanning several blocks, vs NumPy."""
    import cupy as cp

    from gpuactors.engine import EnqueueBatch

    rng = _rng()
    sizes = rng.integers(1, 300_000, 64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    data_h = rng.integers(0, 256, int(sizes.sum()), dtype=np.uint8)
    hist = cp.zeros(64 * 256, dtype=cp.uint32)
    reply = await engine.ref.ask(
        EnqueueBatch(
            op="byte_hist",
            args=(hist, cp.asarray(data_h)),
            n=sizes,
            offsets={"out": np.arange(64) * 256, "data": starts},
            blocks=6,
        ),
        timeout=60,
    )
    assert reply.failed == 0
    got = cp.asnumpy(hist).reshape(64, 256)
    for job in range(64):
        chunk = data_h[starts[job] : starts[job] + sizes[job]]
        np.testing.assert_array_equal(got[job], np.bincount(chunk, minlength=256))


async def test_enqueue_batch_per_task_statuses_and_validation(engine: Engine) -> None:
    import cupy as cp

    from gpuactors.engine import EnqueueBatch

    values = np.array([3, -1, 0, -7, 5], dtype=np.int32)
    reply = await engine.ref.ask(
        EnqueueBatch(op="fail_if_negative", args=(0,), scalars={"v": values}, per_task=True)
    )
    assert reply.failed == 2
    assert reply.statuses.tolist() == [0, 42, 0, 42, 0]
    out = cp.zeros(10, dtype=cp.float32)
    bad = [
        EnqueueBatch(op="fill", args=(out, 1.0), n=1, offsets={"out": np.array([0, 10])}),
        EnqueueBatch(op="fill", args=(out, 1.0), n=np.array([1, 1]), offsets={"out": [0, 1, 2]}),
        EnqueueBatch(op="fill", args=(out, 1.0), n=1, offsets={"value": np.array([0])}),
        EnqueueBatch(op="fill", args=(out, 1.0), n=1, scalars={"value": np.array([np.inf])}),
        EnqueueBatch(op="fill", args=(out, 1.0), n=1, offsets={"out": np.array([-1])}),
        EnqueueBatch(op="sum", args=(out, out), n=1, count=2, blocks=2),
    ]
    for message in bad:
        with pytest.raises(InvalidArgument):
            await engine.ref.ask(message, timeout=10)
    assert float(out.sum()) == 0.0, "a rejected batch must not run any task"


STAMP = OpSpec(
    name="stamp",
    params=(ArrayParam(name="out", dtype="int32", direction="out", length=1),),
    body="if (threadIdx.x == 0) out[0] = 1;\nreturn 0;",
)


def _stamp_body(version: int) -> str:
    return f"if (threadIdx.x == 0) out[0] = {version};\nreturn 0;"


async def _traffic_with(
    engine: Engine, action: Any, clients: int = 50
) -> list[tuple[int, int, float, float]]:
    """Clients stamp their own output slots while `action` runs.

    Returns (slot, version, sent_at, replied_at) per task. Every task must report
    the version it ran, and its slot must hold exactly that version: nothing lost,
    duplicated or run by a half-installed op.
    """
    import cupy as cp

    slots = 400_000
    out = cp.zeros(slots, dtype=cp.int32)
    cp.cuda.get_current_stream().synchronize()
    next_slot = 0
    results: list[tuple[int, int, float, float]] = []
    stop = asyncio.Event()

    async def client() -> None:
        nonlocal next_slot
        while not stop.is_set() and next_slot < slots:
            slot = next_slot
            next_slot += 1
            sent = time.perf_counter()
            done = await engine.ref.ask(
                Enqueue(op="stamp", args=(out[slot : slot + 1],), n=1, after="none"), timeout=30
            )
            results.append((slot, done.version, sent, time.perf_counter()))

    flows = [asyncio.ensure_future(client()) for _ in range(clients)]
    await asyncio.sleep(0.1)
    await action()
    await asyncio.sleep(0.1)
    stop.set()
    await asyncio.gather(*flows)
    written = cp.asnumpy(out)
    assert len({r[0] for r in results}) == len(results)
    wrong = [(r[0], r[1], int(written[r[0]])) for r in results if written[r[0]] != r[1]]
    assert not wrong, f"{len(wrong)} tasks ran another version than they report: {wrong[:5]}"
    assert int(np.count_nonzero(written)) == len(results), "a task ran that nobody accepted"
    return results


async def test_hot_swap_under_load_loses_nothing() -> None:
    from gpuactors.engine import ReplaceOp

    async with ActorSystem("swap") as system:
        engine = await Engine.start(system, ops=(STAMP,))
        times: dict[str, float] = {}

        async def swap() -> None:
            times["sent"] = time.perf_counter()
            installed = await engine.ref.ask(
                ReplaceOp(name="stamp", body=_stamp_body(2)), timeout=60
            )
            times["replied"] = time.perf_counter()
            assert installed.version == 2 and installed.active and installed.engine_module == 2

        results = await _traffic_with(engine, swap)
        assert len(results) > 1000
        assert all(v == 1 for _, v, sent, _ in results if sent < times["sent"])
        assert all(v == 2 for _, v, sent, _ in results if sent > times["replied"])
        assert {v for _, v, _, _ in results} == {1, 2}
        stats = await engine.stats()
        assert "stamp@2" in stats.ops
        await engine.shutdown(timeout=30)


async def test_alias_and_rollback_under_load() -> None:
    import cupy as cp

    from gpuactors.engine import AliasOp, InstallOp, Rollback

    async with ActorSystem("alias") as system:
        engine = await Engine.start(system, ops=(STAMP,))
        v2 = STAMP.model_copy(update={"version": 2, "body": _stamp_body(2)})
        installed = await engine.ref.ask(InstallOp(op=v2, activate=False), timeout=60)
        assert installed.version == 2 and not installed.active
        times: dict[str, float] = {}

        async def switch() -> None:
            times["alias_sent"] = time.perf_counter()
            aliased = await engine.ref.ask(AliasOp(name="stamp", version=2))
            times["alias_replied"] = time.perf_counter()
            assert aliased.previous == 1
            await asyncio.sleep(0.1)
            times["rollback_sent"] = time.perf_counter()
            rolled = await engine.ref.ask(Rollback(name="stamp"))
            times["rollback_replied"] = time.perf_counter()
            assert (rolled.version, rolled.previous) == (1, 2)

        results = await _traffic_with(engine, switch)
        # The documented rule: the version is bound when the engine accepts the task.
        for _, version, sent, replied in results:
            if replied < times["alias_sent"] or sent > times["rollback_replied"]:
                assert version == 1
            elif sent > times["alias_replied"] and replied < times["rollback_sent"]:
                assert version == 2
        assert {v for _, v, _, _ in results} == {1, 2}
        out = cp.zeros(1, dtype=cp.int32)
        done = await engine.enqueue("stamp", out, n=1)
        assert done.version == 1 and int(out[0]) == 1
        await engine.shutdown(timeout=30)


async def test_failed_compile_keeps_the_running_version_serving() -> None:
    import cupy as cp

    from gpuactors.engine import ReplaceOp
    from gpuactors.errors import CompileError

    async with ActorSystem("bad-swap") as system:
        engine = await Engine.start(system, ops=(STAMP,))

        async def broken_swap() -> None:
            with pytest.raises(CompileError, match="op:stamp@2"):
                await engine.ref.ask(ReplaceOp(name="stamp", body="out[0] = ;"), timeout=60)

        results = await _traffic_with(engine, broken_swap)
        assert {v for _, v, _, _ in results} == {1}
        out = cp.zeros(1, dtype=cp.int32)
        assert (await engine.enqueue("stamp", out, n=1)).version == 1
        await engine.shutdown(timeout=30)


async def test_random_hostile_arguments_then_correct_traffic(engine: Engine) -> None:
    """Hundreds of random argument mixes: each is refused with a typed error or runs and
    gives NumPy's result; afterwards nothing is in flight and correct traffic still works."""
    import cupy as cp

    from gpuactors.errors import GpuActorsError

    rng = np.random.default_rng(11)
    dtypes = [np.float32, np.float64, np.int32, np.uint8]
    scalars: list[Any] = [
        1.5,
        -2.0,
        float("nan"),
        float("inf"),
        "x",
        None,
        3,
        2**40,
        np.float32(0.5),
    ]
    accepted = refused = 0
    for _ in range(300):
        size = int(rng.integers(0, 200))
        base = cp.asarray(rng.standard_normal(size * 2 + 2)).astype(dtypes[rng.integers(0, 4)])
        out = base[:size] if rng.random() < 0.8 else base[: size * 2 : 2]
        src = cp.asarray(rng.standard_normal(int(rng.integers(0, 200)))).astype(
            dtypes[rng.integers(0, 4)]
        )
        n = int(rng.integers(-3, 220))
        value = scalars[rng.integers(0, len(scalars))]
        op = ["fill", "copy"][rng.integers(0, 2)]
        args = (out, value) if op == "fill" else (out, src)
        before = cp.asnumpy(out).copy()
        try:
            await engine.ref.ask(Enqueue(op=op, args=args, n=n, after="current_stream"), timeout=10)
        except GpuActorsError:
            refused += 1
            np.testing.assert_array_equal(cp.asnumpy(out), before)  # a refused task wrote nothing
            continue
        except (ValueError, OverflowError) as exc:  # pragma: no cover - would be a bug
            raise AssertionError(f"untyped error {exc!r} for {op} n={n} value={value!r}") from exc
        accepted += 1
        got = cp.asnumpy(out)[:n]
        if op == "fill":
            np.testing.assert_array_equal(got, np.full(n, np.float32(float(value))))
        else:
            np.testing.assert_array_equal(got, cp.asnumpy(src)[:n])
    assert accepted > 10 and refused > 100
    stats = await engine.stats()
    assert stats.in_flight == 0 and stats.queue_depth == 0
    await _check_all_ops(engine)


async def test_fail_fast_policy_with_coalesced_asks() -> None:
    """With full_policy="fail", asks beyond the ring's room get QueueFull at once; the rest
    (published together, one store and one kick) all complete after the engine resumes."""
    import cupy as cp

    from gpuactors.errors import QueueFull

    async with ActorSystem("fail-fast") as system:
        engine = await Engine.start(system, config=EngineConfig(capacity=64), full_policy="fail")
        acc = cp.zeros(200, dtype=cp.float32)
        one = cp.ones(1, dtype=cp.float32)
        cp.cuda.get_current_stream().synchronize()
        async with engine.parked():
            futures = [
                asyncio.ensure_future(
                    engine.ref.ask(
                        Enqueue(op="axpy", args=(acc[k : k + 1], one, 1.0), n=1, after="none")
                    )
                )
                for k in range(200)
            ]
            await asyncio.sleep(0.05)
            refused = [f for f in futures if f.done() and isinstance(f.exception(), QueueFull)]
            assert len(refused) == 200 - 64, "exactly the ring's room was accepted"
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        done = [k for k, o in enumerate(outcomes) if not isinstance(o, BaseException)]
        assert len(done) == 64
        ran = np.flatnonzero(cp.asnumpy(acc)).tolist()
        assert ran == done
        await engine.shutdown(timeout=30)


async def test_prepare_op_makes_the_swap_a_cache_hit(engine: Engine) -> None:
    """PrepareOp compiles ahead; the InstallOp that follows takes the module from the cache."""
    import cupy as cp

    from gpuactors.engine import InstallOp, PrepareOp

    marker = int(time.time_ns() % 1_000_000)  # a body no cache has seen
    op = OpSpec(
        name="prepared",
        params=(ArrayParam(name="out", dtype="int32", direction="out", length=1),),
        body=f"if (threadIdx.x == 0) out[0] = {marker};\nreturn 0;",
    )
    prepared = await engine.ref.ask(PrepareOp(op=op), timeout=120)
    installed = await engine.ref.ask(InstallOp(op=op), timeout=120)
    assert installed.compile_ms * 5 < prepared.compile_ms, (prepared, installed)
    out = cp.zeros(1, dtype=cp.int32)
    await engine.enqueue("prepared", out, n=1)
    assert int(out[0]) == marker
