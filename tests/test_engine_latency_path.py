"""The engine's latency path (``PersistentEngineActor.enqueue``) without a GPU: a host
ring whose consumer stands in for the kernel, finishing each task with the status a
test chooses when the engine kicks it. Every way a task can go (answered at once,
failed on the device, still running, refused, queued) and what each leaves in the
engine's statistics and the ring."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorRef, ActorSystem, Deferred, Props
from gpuactors.cuda.generation import GENERATIONS
from gpuactors.engine import abi
from gpuactors.engine.abi import COMPLETION, RING_RECORD
from gpuactors.engine.actor import PersistentEngineActor
from gpuactors.engine.host_runtime import HostBytes
from gpuactors.engine.messages import BatchCompletion, Completion, Enqueue, EnqueueBatch
from gpuactors.engine.ops import ArrayParam, OpSpec, ScalarParam
from gpuactors.engine.ring import HostConsumer, HostRing
from gpuactors.engine.runtime import EngineConfig
from gpuactors.engine.wire import PAYLOAD_MASK
from gpuactors.errors import (
    DeviceFault,
    EngineStopped,
    GpuRefStale,
    InvalidArgument,
    TaskFailed,
    TaskTimeout,
    UnknownOp,
)
from test_engine_word_encoders import CupyLikeArray

SCALE = OpSpec(
    name="scale",
    params=(
        ArrayParam(name="out", dtype="float32", direction="out"),
        ScalarParam(name="a", dtype="float32"),
    ),
    body="return 0;",
)
RUNNING = None  # the consumer leaves the task running


pytestmark = pytest.mark.usefixtures("cupy_like_arrays")


class HostRuntime:
    """What the actor uses of an EngineRuntime: a ring, and a kick that lets the host
    consumer take every published task and finish it with ``status`` (or not)."""

    def __init__(self, status: int | None) -> None:
        records = np.zeros(64, dtype=RING_RECORD)
        completions = np.zeros(64, dtype=COMPLETION)
        records["seq"] = np.arange(64, dtype=np.uint64)
        self.ring = HostRing(records, completions)
        self.consumer = HostConsumer(records, completions)
        self.status = status
        self.kicks = 0
        self.taken: list[tuple[int, Any]] = []
        self.grid = 2
        self.allocate = HostBytes  # (an expanded batch's descriptor)

    def measure_clock_if_old(self) -> None:
        pass  # (the host clock is the device's here)

    def kick(self) -> bool:
        self.kicks += 1
        if self.status is not RUNNING:
            for seq, record in self.consumer.take():
                self.taken.append((seq, record))
                self.consumer.complete(seq, self.status, units=3, t_ns=0)
        return False


def engine(status: int | None = abi.STATUS_OK, **config: Any) -> PersistentEngineActor:
    actor = PersistentEngineActor([SCALE], EngineConfig(**config))
    actor._service.runtime = HostRuntime(status)  # type: ignore[assignment]
    actor._service.generation = GENERATIONS.current(0)
    return actor


class Unpolled(PersistentEngineActor):
    """The engine actor on this file's host runtime, spawned as every actor is (its
    handlers take the asker's reply future), with no poller: the test harvests."""

    def __init__(self, status: int | None, config: EngineConfig | None = None) -> None:
        super().__init__([SCALE], config or EngineConfig())
        self._status = status

    async def pre_start(self) -> None:
        self._service.runtime = HostRuntime(self._status)  # type: ignore[assignment]
        self._service.generation = GENERATIONS.current(0)


@asynccontextmanager
async def spawned(
    status: int | None, config: EngineConfig | None = None
) -> AsyncIterator[tuple[ActorRef, Unpolled]]:
    async with ActorSystem("latency-path") as system:
        ref = system.spawn(Props(Unpolled, args=(status, config)), "engine")
        await asyncio.sleep(0.01)  # (pre_start)
        actor = ref._cell.instance
        assert isinstance(actor, Unpolled)
        yield ref, actor
        actor._completions.pending.clear()  # (the ring stays as the test left it)


def runtime_of(actor: PersistentEngineActor) -> HostRuntime:
    runtime = actor._service.runtime
    assert isinstance(runtime, HostRuntime)
    return runtime


def task(a: Any = 1.5, **fields: Any) -> Enqueue:
    return Enqueue(
        op="scale", args=(CupyLikeArray("float32", 8, 4096), a), n=4, after="none", **fields
    )


def error_of(reply: object) -> BaseException | None:
    assert isinstance(reply, Deferred) and reply.future.done()
    return reply.future.exception()


# A Python float takes the publisher; a NumPy scalar the general path.
PATHS = pytest.mark.parametrize("a", [1.5, np.float32(1.5)], ids=["publisher", "general"])


@PATHS
async def test_a_task_that_finishes_within_the_spin_is_answered_at_once(a: Any) -> None:
    actor = engine()
    reply = actor.enqueue(task(a))
    assert isinstance(reply, Completion)  # no future: the reply itself
    assert (reply.seq, reply.op, reply.version, reply.status, reply.units) == (1, "scale", 1, 0, 3)
    assert reply == Completion(seq=1, op="scale", version=1, status=0, units=3, device_ns=0)
    assert (
        actor._completions.processed == 1
        and actor._completions.failed == 0
        and len(actor._completions.latencies) == 1
    )
    assert not actor._completions.pending and runtime_of(actor).kicks == 1
    ring = runtime_of(actor).ring
    assert ring._unretired[0] == 0  # retired


@PATHS
@pytest.mark.parametrize(
    ("status", "error"),
    [(5, TaskFailed), (abi.STATUS_DEADLINE, TaskTimeout), (abi.STATUS_UNKNOWN_OP, UnknownOp)],
)
async def test_a_device_failure_is_the_askers_error(a: Any, status: int, error: type) -> None:
    actor = engine(status)
    assert isinstance(error_of(actor.enqueue(task(a))), error)
    assert (
        actor._completions.processed == 0
        and actor._completions.failed == 1
        and len(actor._completions.latencies) == 1
    )


@PATHS
async def test_a_task_still_running_after_the_spin_is_left_to_the_poller(a: Any) -> None:
    async with spawned(RUNNING) as (ref, actor):
        reply = asyncio.ensure_future(ref.ask(task(a)))
        await asyncio.sleep(0)  # asked: answered at once, the reply still to come
        assert not reply.done()
        assert list(actor._completions.pending) == [1] and actor._completions.processed == 0
        runtime = runtime_of(actor)
        (seq, _record), *_ = runtime.consumer.take()
        runtime.consumer.complete(seq, abi.STATUS_OK, units=1, t_ns=0)
        assert actor._completions.harvest(runtime.ring) == 1  # what the poller does
        done = await asyncio.wait_for(reply, 5)
        assert isinstance(done, Completion) and done.seq == 1 and actor._completions.processed == 1


async def test_a_busy_engine_stages_the_task_for_one_publish_per_loop_turn() -> None:
    async with spawned(RUNNING) as (ref, actor):
        first = asyncio.ensure_future(ref.ask(task()))
        await asyncio.sleep(0)
        assert actor._service.runtime is not None and actor._service.runtime.ring.published == 1
        # The first is in flight: the next asks are coalesced, published together.
        second = asyncio.ensure_future(ref.ask(task()))
        third = asyncio.ensure_future(ref.ask(task()))
        seen = set()
        for _ in range(20):
            seen.add(actor._service.runtime.ring.published)
            await asyncio.sleep(0)
        assert seen == {1, 3} and not actor._intake.staged
        assert not first.done() and not second.done() and not third.done()
        for future in (first, second, third):
            future.cancel()


@pytest.mark.parametrize(
    ("timeout", "config", "expect"),
    [
        (None, {}, "default"),
        (None, {"default_task_timeout_s": None}, "none"),
        (2.5, {"default_task_timeout_s": None}, "own"),
        (1e-10, {}, "passed"),  # under 1 ns: a deadline that has passed, never "none"
    ],
    ids=["default", "no default", "own timeout", "tiny timeout"],
)
@PATHS
async def test_deadlines(
    a: Any, timeout: float | None, config: dict[str, Any], expect: str
) -> None:
    actor = engine(**config)
    before = time.time_ns()
    actor.enqueue(task(a, timeout=timeout))
    after = time.time_ns()
    (_seq, record), *_ = runtime_of(actor).taken
    deadline = int(record["deadline_ns"])
    rounding = 1 << abi.DEADLINE_SHIFT  # deadlines travel in units of 1024 ns, rounded up
    if expect == "none":
        assert deadline == 0
    else:
        span = {"default": 60e9, "own": 2.5e9, "passed": 0}[expect]
        assert before + span <= deadline <= after + span + rounding
    assert deadline <= PAYLOAD_MASK << abi.DEADLINE_SHIFT


@PATHS
@pytest.mark.parametrize(
    ("state", "error"),
    [
        ({"faulted": "a fault"}, DeviceFault),
        ({"closing": True}, EngineStopped),
        ({"generation": 10**6}, GpuRefStale),
    ],
    ids=["faulted", "closing", "stale generation"],
)
async def test_an_engine_out_of_service_refuses_and_publishes_nothing(
    a: Any, state: dict[str, Any], error: type
) -> None:
    actor = engine()
    for name, value in state.items():
        setattr(actor._service, name, value)
    assert isinstance(error_of(actor.enqueue(task(a))), error)
    assert actor._service.runtime is not None and actor._service.runtime.ring.published == 0


async def test_bad_arguments_and_unknown_ops_are_refused_before_the_ring() -> None:
    actor = engine()
    assert isinstance(error_of(actor.enqueue(task("not a number"))), InvalidArgument)
    unknown = Enqueue(op="nope", args=(), n=1, after="none")
    assert isinstance(error_of(actor.enqueue(unknown)), UnknownOp)
    assert actor._service.runtime is not None and actor._service.runtime.ring.published == 0
    assert (
        actor._completions.processed == actor._completions.failed == 0
    )  # the asker's errors, not the device's


@PATHS
async def test_a_full_ring_queues_the_task_until_there_is_room(a: Any) -> None:
    async with spawned(RUNNING) as (ref, actor):
        assert actor._service.runtime is not None
        ring = actor._service.runtime.ring
        while ring.try_publish(0, 1, [0, 0]) is not None:
            pass
        reply = asyncio.ensure_future(ref.ask(task(a)))
        await asyncio.sleep(0)
        assert not reply.done()
        assert len(actor._intake.backlog) + len(actor._intake.staged) == 1 and ring.published == 64
        reply.cancel()


def batch(count: int) -> EnqueueBatch:
    return EnqueueBatch(
        op="scale",
        args=(CupyLikeArray("float32", 8 * count, 4096), 1.5),
        n=8,
        offsets={"out": np.arange(count) * 8},
        after="none",
        per_task=True,
    )


@pytest.mark.parametrize("status", [abi.STATUS_OK, 5])
async def test_a_batch_that_finishes_within_the_spin_on_an_idle_engine_is_answered_in_line(
    status: int,
) -> None:
    """No poller runs here: the batch's reply comes from its own handler."""
    async with spawned(status) as (ref, actor):
        done = await asyncio.wait_for(ref.ask(batch(3)), 5)
        assert isinstance(done, BatchCompletion)
        assert (done.first_seq, done.count) == (1, 3)
        assert done.failed == (0 if status == abi.STATUS_OK else 3)
        assert list(done.statuses) == [0 if status == abi.STATUS_OK else status] * 3
        assert not actor._completions.batches
        assert list(runtime_of(actor).ring._unretired[:3]) == [0, 0, 0]  # retired


async def test_a_batch_still_running_after_the_spin_is_left_to_the_poller() -> None:
    async with spawned(RUNNING) as (ref, actor):
        reply = asyncio.ensure_future(ref.ask(batch(2)))
        await asyncio.sleep(0.01)
        assert not reply.done() and len(actor._completions.batches) == 1
        runtime = runtime_of(actor)
        for seq, _record in runtime.consumer.take():
            runtime.consumer.complete(seq, abi.STATUS_OK, units=1, t_ns=0)
        assert actor._completions.harvest_batches(runtime.ring) == 2  # what the poller does
        done = await asyncio.wait_for(reply, 5)
        assert isinstance(done, BatchCompletion) and done.failed == 0


async def test_a_batch_behind_a_running_task_is_left_to_the_poller() -> None:
    """Only an otherwise idle engine answers a batch in line: with a task in flight,
    the batch waits for the poller, which harvests both."""
    async with spawned(RUNNING) as (ref, actor):
        lone = asyncio.ensure_future(ref.ask(task()))
        await asyncio.sleep(0.01)
        runtime = runtime_of(actor)
        runtime.status = abi.STATUS_OK  # from now on the consumer finishes what it takes
        reply = asyncio.ensure_future(ref.ask(batch(2)))
        await asyncio.sleep(0.01)
        assert not reply.done() and len(actor._completions.batches) == 1
        for seq, _record in runtime.consumer.take():
            runtime.consumer.complete(seq, abi.STATUS_OK, units=1, t_ns=0)
        assert (
            actor._completions.harvest(runtime.ring)
            + actor._completions.harvest_batches(runtime.ring)
            == 3
        )
        assert isinstance(await asyncio.wait_for(lone, 5), Completion)
        assert (await asyncio.wait_for(reply, 5)).failed == 0


async def test_an_expanded_batch_is_left_to_the_poller_even_on_an_idle_engine() -> None:
    """Its one record finished at once here, yet no spin waits for it: the poller
    answers (an expanded batch mostly outlasts the spin, which would hold the loop)."""
    async with spawned(abi.STATUS_OK, EngineConfig(expand_batches_from=2)) as (ref, actor):
        reply = asyncio.ensure_future(ref.ask(batch(3)))
        await asyncio.sleep(0.01)
        assert not reply.done() and len(actor._completions.batches) == 1
        runtime = runtime_of(actor)
        assert runtime.ring.published == 1  # the batch's one record
        assert actor._completions.harvest_batches(runtime.ring) == 1  # what the poller does
        done = await asyncio.wait_for(reply, 5)
        assert isinstance(done, BatchCompletion)
        assert (done.count, done.failed, list(done.statuses)) == (3, 0, [0, 0, 0])
