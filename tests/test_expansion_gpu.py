"""Batches the device expands from one ring record, on a real GPU: every task's
arguments and result, per-task failures and deadlines, the headline scan jobs, and a
hot swap while expanded batches run."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from gpuactors.actors import ActorSystem
from gpuactors.cuda import no_device_reason
from gpuactors.engine import (
    ArrayParam,
    Engine,
    EngineConfig,
    EnqueueBatch,
    OpSpec,
    ReplaceOp,
    ScalarParam,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(no_device_reason() is not None, reason=str(no_device_reason())),
]

ECHO = OpSpec(  # each task's words and n, back out
    name="echo",
    params=(
        ArrayParam(name="out", dtype="uint64", direction="out", length=5),
        ScalarParam(name="f", dtype="float64"),
        ScalarParam(name="i", dtype="int64"),
        ScalarParam(name="u", dtype="uint64"),
        ScalarParam(name="shared", dtype="uint64"),
    ),
    body="""if (threadIdx.x == 0) {
    out[0] = __double_as_longlong(f); out[1] = i; out[2] = u; out[3] = shared; out[4] = n;
}
return 0;""",
)
FAIL_IF_NEG = OpSpec(
    name="fail_if_negative",
    params=(ScalarParam(name="v", dtype="int32"),),
    body="return v < 0 ? 42 : 0;",
)
SLOW_MARK = OpSpec(  # about 20 us of one block, then a mark: which tasks ran
    name="slow_mark",
    params=(ArrayParam(name="out", dtype="int32", direction="out", length=1),),
    body="""const unsigned long long until = clock64() + 40000;
while (clock64() < until) {}
if (threadIdx.x == 0) out[0] = 1;
return 0;""",
)
STAMP = OpSpec(
    name="stamp",
    params=(ArrayParam(name="out", dtype="int32", direction="out", length=1),),
    body="if (threadIdx.x == 0) out[0] = 1;\nreturn 0;",
)
MARK_N = OpSpec(  # each task's n, at its offset
    name="mark_n",
    params=(ArrayParam(name="out", dtype="int64", direction="out", length=1),),
    body="if (threadIdx.x == 0) out[0] = (long long)n;\nreturn 0;",
)
OPS = (ECHO, FAIL_IF_NEG, SLOW_MARK, STAMP, MARK_N)


async def _echo_outputs(expand_from: int | None, count: int, seed: int) -> np.ndarray:
    import cupy as cp

    rng = np.random.default_rng(seed)
    config = EngineConfig(expand_batches_from=expand_from, capacity=1024, idle_park_ms=50.0)
    async with ActorSystem(f"echo-{expand_from}") as system:
        engine = await Engine.start(system, ops=OPS, config=config)
        out = cp.zeros(5 * count, dtype=cp.uint64)
        cp.cuda.get_current_stream().synchronize()
        reply = await engine.ref.ask(
            EnqueueBatch(
                op="echo",
                args=(out, 0.0, 0, 0, 2**64 - 3),
                n=rng.integers(2**56, 2**62, count),
                offsets={"out": rng.permutation(count) * 5},
                scalars={
                    "f": rng.standard_normal(count) * 1e200,
                    "i": rng.integers(-(2**63), 2**63 - 1, count, dtype=np.int64),
                    "u": rng.integers(0, 2**64 - 1, count, dtype=np.uint64),
                },
                timeout=30.0,
            ),
            timeout=60,
        )
        assert (reply.count, reply.failed) == (count, 0)
        result = cp.asnumpy(out).reshape(count, 5)
        await engine.shutdown(timeout=30)
    return result


async def test_expanded_and_record_by_record_batches_give_every_task_the_same_words() -> None:
    seed = int(time.time_ns() % 2**32)
    count = 3000  # more than the ring's 1,024 slots, record by record
    expanded = await _echo_outputs(256, count, seed)
    by_record = await _echo_outputs(None, count, seed)
    np.testing.assert_array_equal(expanded, by_record)
    assert (expanded[:, 3] == 2**64 - 3).all()  # the shared word, in every task


async def test_per_task_failures_come_back_by_index() -> None:
    rng = np.random.default_rng(int(time.time_ns() % 2**32))
    values = rng.integers(-5, 100, 10_000).astype(np.int32)
    async with ActorSystem("failures") as system:
        engine = await Engine.start(system, ops=OPS)
        reply = await engine.ref.ask(
            EnqueueBatch(op="fail_if_negative", args=(0,), scalars={"v": values}, per_task=True),
            timeout=60,
        )
        expected = np.where(values < 0, 42, 0)
        assert reply.failed == int(np.count_nonzero(expected))
        np.testing.assert_array_equal(reply.statuses, expected)
        clean = await engine.ref.ask(
            EnqueueBatch(op="fail_if_negative", args=(1,), count=5000, per_task=True), timeout=60
        )
        assert (clean.count, clean.failed) == (5000, 0) and not clean.statuses.any()
        stats = await engine.stats()
        assert (stats.processed, stats.failed) == (15_000 - reply.failed, reply.failed)
        await engine.shutdown(timeout=30)


async def test_tasks_claimed_after_the_deadline_are_skipped() -> None:
    import cupy as cp

    count = 4000  # about 80 ms of work on two worker blocks, against a 10 ms deadline
    config = EngineConfig(grid_blocks=3, idle_park_ms=50.0)
    async with ActorSystem("deadline") as system:
        engine = await Engine.start(system, ops=OPS, config=config)
        out = cp.zeros(count, dtype=cp.int32)
        cp.cuda.get_current_stream().synchronize()
        reply = await engine.ref.ask(
            EnqueueBatch(
                op="slow_mark",
                args=(out,),
                offsets={"out": np.arange(count)},
                timeout=0.01,
                per_task=True,
            ),
            timeout=60,
        )
        ran = cp.asnumpy(out) == 1
        statuses = reply.statuses
        assert set(np.unique(statuses).tolist()) == {-2, 0}
        np.testing.assert_array_equal(ran, statuses == 0)  # skipped tasks never ran
        assert reply.failed == int(np.count_nonzero(statuses))
        await engine.shutdown(timeout=30)


async def test_expanded_scan_jobs_match_numpy() -> None:
    import cupy as cp

    rng = np.random.default_rng(int(time.time_ns() % 2**32))
    jobs = 10_000
    data = rng.integers(0, 256, jobs * 1024, dtype=np.uint8)
    async with ActorSystem("scans") as system:
        engine = await Engine.start(system)
        hist = cp.zeros(jobs * 256, dtype=cp.uint32)
        reply = await engine.ref.ask(
            EnqueueBatch(
                op="byte_hist",
                args=(hist, cp.asarray(data)),
                n=1024,
                offsets={"out": np.arange(jobs) * 256, "data": np.arange(jobs) * 1024},
            ),
            timeout=60,
        )
        assert (reply.count, reply.failed) == (jobs, 0)
        got = cp.asnumpy(hist).reshape(jobs, 256)
        for job in rng.choice(jobs, 200, replace=False):
            chunk = data[job * 1024 : (job + 1) * 1024]
            np.testing.assert_array_equal(got[job], np.bincount(chunk, minlength=256))
        assert int(got.sum()) == jobs * 1024
        await engine.shutdown(timeout=30)


async def test_a_hot_swap_between_expanded_batches_keeps_each_batchs_version() -> None:
    """Each batch runs the version its name pointed at when it was accepted, however the
    swap falls; no task is lost or run twice."""
    import cupy as cp

    count = 200_000
    async with ActorSystem("swap") as system:
        engine = await Engine.start(system, ops=OPS)
        outs = [cp.zeros(count, dtype=cp.int32) for _ in range(6)]
        cp.cuda.get_current_stream().synchronize()

        def send(out: object) -> asyncio.Future[object]:
            return asyncio.ensure_future(
                engine.ref.ask(
                    EnqueueBatch(op="stamp", args=(out,), offsets={"out": np.arange(count)}),
                    timeout=60,
                )
            )

        before = [send(out) for out in outs[:3]]
        swap = asyncio.ensure_future(
            engine.ref.ask(
                ReplaceOp(name="stamp", body="if (threadIdx.x == 0) out[0] = 2;\nreturn 0;"),
                timeout=120,
            )
        )
        await swap
        after = [send(out) for out in outs[3:]]
        for reply in await asyncio.gather(*before, *after):
            assert (reply.count, reply.failed) == (count, 0)  # type: ignore[attr-defined]
        for index, out in enumerate(outs):
            values = np.unique(cp.asnumpy(out))
            expected = [1] if index < 3 else [2]
            assert values.tolist() == expected, index
        await engine.shutdown(timeout=30)


async def test_evenly_spaced_offsets_reach_every_task_of_every_record() -> None:
    """Offsets found evenly spaced, given as a range, or running backwards: no column
    is copied, and each task of both records (65,536 tasks each) writes where its
    offset says (its n, a column that is copied, says which task it was)."""
    import cupy as cp

    count = 70_000
    n = np.arange(1, count + 1)
    forward = 11 + 3 * np.arange(count)
    cases = {
        "found": forward,
        "range": range(11, 11 + 3 * count, 3),
        "backwards": range(11 + 3 * (count - 1), 10, -3),
    }
    async with ActorSystem("spaced") as system:
        engine = await Engine.start(system, ops=OPS)
        for name, offsets in cases.items():
            out = cp.zeros(3 * count + 20, dtype=cp.int64)
            cp.cuda.get_current_stream().synchronize()
            reply = await engine.ref.ask(
                EnqueueBatch(op="mark_n", args=(out,), n=n, offsets={"out": offsets}),
                timeout=60,
            )
            assert (reply.count, reply.failed) == (count, 0), name
            expected = np.zeros(3 * count + 20, dtype=np.int64)
            expected[np.asarray(offsets)] = n
            np.testing.assert_array_equal(cp.asnumpy(out), expected, err_msg=name)
        await engine.shutdown(timeout=30)
