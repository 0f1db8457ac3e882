"""The engine's backlog: its order under full_policy="wait", its deadlines under
steady traffic, and the columns a batch may not hold (found by a review: each test
failed before its fix)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest

from gpuactors.actors import ActorSystem
from gpuactors.engine.args import encode_batch
from gpuactors.engine.host_runtime import CupyLikeArray, HostRuntime
from gpuactors.engine.host_runtime import cupy_like_arrays as _cupy_like
from gpuactors.engine.messages import EnqueueBatch
from gpuactors.engine.ops import BUILTIN_OPS
from gpuactors.errors import InvalidArgument, TaskTimeout
from test_engine_on_host import Stream, fill, fill_batch, loop_turns_until, start
from test_engine_on_host import stream as stream

FILL = BUILTIN_OPS[0]


@pytest.fixture(autouse=True)
def cupy_like_arrays() -> Iterator[None]:
    with _cupy_like():
        yield


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("backlog") as actor_system:
        yield actor_system


async def test_a_staged_task_is_not_overtaken_by_a_later_batch(system: ActorSystem) -> None:
    runtime = HostRuntime(auto=False)
    ref, engine = await start(system, runtime, full_policy="wait")
    first = asyncio.ensure_future(ref.ask(fill()))
    await loop_turns_until(lambda: engine._completions.pending)  # busy: the next is staged
    ref.tell(fill(n=8))  # accepted first
    ref.tell(fill_batch(1, n=16))  # accepted second, in the same run of the actor
    await loop_turns_until(lambda: not engine._intake.staged and runtime.ring.published > 1)
    for _ in range(20):
        runtime.finish()
        await asyncio.sleep(0.002)
    await asyncio.wait_for(first, 2)
    order = [int(record["n"]) for _seq, record in runtime.taken]
    assert order == [8, 8, 16], order  # FIFO: the task accepted first runs first


async def test_a_ready_staged_task_does_not_wait_for_a_later_tasks_inputs(
    stream: Stream, system: ActorSystem
) -> None:
    runtime = HostRuntime(auto=False)
    ref, engine = await start(system, runtime, full_policy="wait")
    first = asyncio.ensure_future(ref.ask(fill()))
    await loop_turns_until(lambda: engine._completions.pending)
    stream.busy = True  # the later task's inputs are not ready
    ref.tell(fill(n=8))  # after="none": ready, accepted first
    ref.tell(fill(n=16, after="current_stream"))  # accepted second: waits for its inputs
    await loop_turns_until(lambda: stream.events)
    for _ in range(10):
        runtime.finish()
        await asyncio.sleep(0.002)
    await asyncio.wait_for(first, 2)
    # The earlier, ready task must have been published; it is held behind the later
    # task's inputs instead.
    assert runtime.ring.published == 2, [
        (type(item).__name__, item.n) for item in engine._intake.backlog
    ]


async def test_a_held_task_times_out_under_steady_traffic(
    stream: Stream, system: ActorSystem
) -> None:
    runtime = HostRuntime(auto=False)
    ref, _engine = await start(system, runtime, full_policy="fail")
    stream.busy = True  # its inputs never become ready
    held = asyncio.ensure_future(ref.ask(fill(after="current_stream", timeout=0.05)))
    await loop_turns_until(lambda: stream.events)
    stream.busy = False  # (the traffic's own tasks are after="none" anyway)

    async def traffic() -> None:  # a task in flight at all times, finishing every ~1 ms
        while True:
            task = asyncio.ensure_future(ref.ask(fill()))
            await asyncio.sleep(0.001)
            runtime.finish()
            await task

    running = asyncio.ensure_future(traffic())
    try:
        with pytest.raises(TaskTimeout):  # its deadline was 50 ms; 10x that is ample
            await asyncio.wait_for(asyncio.shield(held), 0.5)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        held.cancel()


@pytest.mark.parametrize("order", ["<", ">"])
@pytest.mark.parametrize("value", [2**63, 2**64 - 1])
@pytest.mark.parametrize("column", ["offsets", "n"])
def test_a_uint64_column_from_2_63_is_refused_for_its_size(
    column: str, value: int, order: str
) -> None:
    huge = np.array([0, value], dtype=f"{order}u8")
    fields: dict[str, Any] = {"n": 8}
    if column == "offsets":
        fields["offsets"] = {"out": huge}
    else:
        fields["n"] = huge
    message = EnqueueBatch(
        op="fill", args=(CupyLikeArray("float32", 1 << 20), 1.0), after="none", **fields
    )
    with pytest.raises(InvalidArgument) as caught:
        encode_batch(FILL, 0, message, 0)
    assert "negative" not in str(caught.value), str(caught.value)
    assert f"must be below 2**62, got {value}" in str(caught.value), str(caught.value)
