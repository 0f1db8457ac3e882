"""Fixes from review (session 35) of EngineGroup's placement count and op record, on CPU
stand-in engines (fake_engines.py).

* Tasks whose caller stopped waiting (a timeout, a cancel) count in flight until their
  engine has drained them: the engine runs them all the same, and the count had let
  them go at once, steering the next host data to the busy engine.
* A local array freed twice, or an array the group never placed, leaves the bytes
  placed where they were: a second free had taken the upload's bytes off again.
* An alias the engines make but answer with different previous versions (an engine
  changed around the group) is recorded before the EngineError: the group's record had
  kept the old version while every engine pointed at the new one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from fake_engines import (
    STAMP,
    STAMP_V2,
    FakeDeviceArray,
    FakeEngineActor,
    FakeLocalMember,
    Journal,
    fake_group_members,
)
from gpuactors.actors import ActorSystem, Deferred, Props, handles
from gpuactors.engine import (
    AliasOp,
    BatchCompletion,
    Completion,
    Drain,
    Drained,
    Engine,
    Enqueue,
    EnqueueBatch,
    ScalarParam,
)
from gpuactors.errors import AskTimeout, EngineError
from gpuactors.group import EngineGroup, PerDevice
from gpuactors.messages import Message
from gpuactors.worker import Job


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("group-review-s35") as system:
        yield system


async def until(condition: Any, seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.005)


# ------------------------------------------------------------ tasks in flight
class _HeldEngine(FakeEngineActor):
    """Takes each task at once and answers it once ``release`` is set; its Drain waits
    for every task it took, whether or not their caller still waits (as an engine's)."""

    def __init__(self, device_id: int, journal: Journal, release: asyncio.Event) -> None:
        super().__init__((), device_id, journal)
        self.release = release
        self.taken: list[asyncio.Future[Any]] = []

    def _held(self, answer: object) -> Deferred[Any]:
        assert isinstance(answer, Completion | BatchCompletion)  # (the test sends good work)

        async def answered() -> Any:
            await self.release.wait()
            return answer

        self.taken.append(asyncio.ensure_future(answered()))
        return Deferred(self.taken[-1])

    @handles(Enqueue)
    def enqueue(self, msg: Enqueue) -> Deferred[Any]:
        return self._held(super().enqueue(msg))

    @handles(EnqueueBatch)
    def enqueue_batch(self, msg: EnqueueBatch) -> Deferred[Any]:
        return self._held(super().enqueue_batch(msg))

    @handles(Drain)
    def drain(self, _msg: Drain) -> Deferred[Drained]:
        async def drained() -> Drained:
            await asyncio.gather(*self.taken)
            return Drained(processed=self.processed)

        return Deferred(asyncio.ensure_future(drained()))

    def post_stop(self) -> None:
        for taken in self.taken:  # (a stopped engine answers none of them)
            taken.cancel()


async def held_group(
    system: ActorSystem, release: asyncio.Event
) -> tuple[EngineGroup, Journal, Any]:
    """Engine 0 holds its tasks until ``release``; an array of 16 bytes on it, 32 on
    engine 1 (so with no task in flight, placement picks engine 0)."""
    journal = Journal([])
    held = system.spawn(Props(_HeldEngine, args=(0, journal, release)))
    other = await FakeLocalMember.start_fake(system, 1, journal)
    group = EngineGroup([FakeLocalMember(Engine(held), 0), other])
    out = await group.upload(np.zeros(4, np.float32), device=0)
    await group.upload(np.zeros(8, np.float32), device=1)
    assert group.pick() == 0
    return group, journal, out


@pytest.mark.parametrize("leaves", ["timeout", "cancel"])
@pytest.mark.parametrize("sent", ["batch", "task", "job"])
async def test_tasks_whose_caller_stopped_waiting_count_until_their_engine_drained_them(
    system: ActorSystem, no_loop_errors: list[dict[str, Any]], sent: str, leaves: str
) -> None:
    """The count had let them go when the caller left, though engine 0 still ran them:
    placement then took it for the idle engine."""
    release = asyncio.Event()
    group, journal, out = await held_group(system, release)
    message: Message = Enqueue(op="fill", args=(out, 1.0), n=1)
    if sent == "batch":
        message = EnqueueBatch(op="fill", args=(out, 1.0), n=1, offsets={"out": range(4)})
    elif sent == "job":  # host data only: placed on engine 0, the least loaded
        message = Job(op="fill", args=(np.zeros(4, np.float32), 1.0), n=1)
    if leaves == "timeout":
        with pytest.raises(AskTimeout):
            await group.ask(message, timeout=0.05)
    else:
        asking = asyncio.ensure_future(group.ask(message))
        await until(lambda: journal.of(0))  # engine 0 took them
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
    assert group.in_flight() == {0: 4 if sent == "batch" else 1, 1: 0}
    assert group.pick() == 1
    release.set()
    await until(lambda: group.in_flight()[0] == 0)
    assert group.pick() == 0


async def test_tasks_whose_engine_stops_before_draining_them_leave_the_count(
    system: ActorSystem, no_loop_errors: list[dict[str, Any]]
) -> None:
    """A Drain the engine cannot answer (it stopped) ends the count: its tasks went
    with it, and they must not weigh on the engine for good."""
    group, _journal, out = await held_group(system, asyncio.Event())
    batch = EnqueueBatch(op="fill", args=(out, 1.0), n=1, offsets={"out": range(4)})
    with pytest.raises(AskTimeout):
        await group.ask(batch, timeout=0.05)
    assert group.in_flight()[0] == 4
    await group.members[0].stop(force=True)
    await until(lambda: group.in_flight()[0] == 0)


# ----------------------------------------------------------------- bytes placed
async def test_a_local_array_freed_twice_takes_its_bytes_off_the_count_once(
    system: ActorSystem,
) -> None:
    """The second free had taken 1000 bytes off device 0 again, hiding the 700 placed
    there since: placement then took device 0 for the emptier one."""
    members, _ = await fake_group_members(system, (0, 1))
    group = EngineGroup(members)
    first = await group.upload(np.zeros(1000, np.uint8), device=0)
    await group.upload(np.zeros(600, np.uint8), device=1)
    await group.free(first)
    await group.upload(np.zeros(700, np.uint8), device=0)
    assert group.pick() == 1
    assert await group.free(first) is None  # as the engine's own free of it: nothing to do
    assert group.pick() == 1


@pytest.mark.parametrize("freed", ["the caller's own", "a view past an upload's start"])
async def test_freeing_an_array_the_group_did_not_place_leaves_the_count(
    system: ActorSystem, freed: str
) -> None:
    """Its own bytes had been taken off the bytes the group placed there."""
    members, _ = await fake_group_members(system, (0, 1))
    group = EngineGroup(members)
    placed = await group.upload(np.zeros(1000, np.uint8), device=0)
    await group.upload(np.zeros(600, np.uint8), device=1)
    assert group.pick() == 1
    own = FakeDeviceArray(np.zeros(1000, np.uint8), 0)
    await group.free(own if freed == "the caller's own" else placed[500:])
    assert group.pick() == 1
    await group.free(placed)  # the upload itself: all its bytes go
    assert group.pick() == 0


# ---------------------------------------------------------------- op versions
async def test_an_alias_answered_with_different_previous_versions_is_recorded(
    system: ActorSystem,
) -> None:
    """Every engine points at v1 after the alias, and the group's record must too: it
    had kept v2, so a batch of v1's one argument was split by v2's two."""
    members, _ = await fake_group_members(system, (0, 1), (STAMP,))
    group = EngineGroup(members, ops=(STAMP,))
    two_params = (*STAMP.params, ScalarParam(name="scale", dtype="int32"))
    assert (await group.replace("stamp", STAMP_V2, params=two_params)).version == 2
    await members[1].ask(AliasOp(name="stamp", version=1))  # around the group
    with pytest.raises(EngineError, match=r"disagree.*0: v1 \(was 2\), 1: v1 \(was 1\)"):
        await group.alias("stamp", 1)
    outs = PerDevice({d: await group.upload(np.zeros(1, np.int32), device=d) for d in (0, 1)})
    batch = EnqueueBatch(op="stamp", args=(outs,), n=1)
    reply = await group.enqueue_batch(batch, devices=np.array([0, 1]))
    assert reply.failed == 0
    for device in (0, 1):
        np.testing.assert_array_equal(await group.download(outs.on(device, "out")), [1])
