"""Edges of the scale-out code (EngineGroup, and the Ray pool over it), on CPU stand-in
engines (fake_engines.py) and a local Ray cluster.

* Op changes whose caller stops waiting (a cancel, AskTimeout, EngineLost): an engine
  applies a change it was sent whether or not its asker still waits, so the version
  numbers the group takes, the versions it records and the changes a Ray member replays
  to a restarted actor must follow what the engines did, not what the caller saw.
* ``group.ask``'s timeout, for every message it takes.
* A batch whose tasks only its ``devices`` column counts.
* Sharded arrays: a scatter that fails part-way, a free that fails on one shard.
* A shutdown where one engine's stop ends in an exit.
* Batches waiting for a Ray actor's link that cannot be had.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from fake_engines import STAMP, STAMP_V2, FakeLocalMember, Journal, fake_group_members, versions_run
from gpuactors.actors import ActorSystem
from gpuactors.engine import (
    BUILTIN_OPS,
    BatchCompletion,
    EnqueueBatch,
    InstallOp,
    OpSpec,
    ReplaceOp,
    ShutdownReport,
    Stats,
)
from gpuactors.engine.args import task_count
from gpuactors.errors import (
    AskTimeout,
    DeviceFault,
    EngineLost,
    GpuRefStale,
    InvalidArgument,
    PartialFailure,
    WrongDevice,
)
from gpuactors.group import EngineGroup, PerDevice
from gpuactors.group.batches import split_batch
from gpuactors.group.routing import Locator
from gpuactors.messages import Message

#: How long a stand-in engine takes to compile, where a test stops waiting meanwhile.
SLOW_COMPILE_S = 0.25


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("scale-review") as system:
        yield system


async def until(condition: Any, seconds: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not condition():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.005)


# ------------------------------------------------------------- EngineGroup
async def test_a_replace_cancelled_while_the_first_engine_compiles_leaves_the_next_free(
    system: ActorSystem, no_loop_errors: list[dict[str, Any]]
) -> None:
    """The first engine installs v2 although its asker was cancelled: the group's next
    replace must not ask for v2 again (every engine would refuse it for ever after)."""
    members, journal = await fake_group_members(system, (0, 1), (STAMP,), compile_s=SLOW_COMPILE_S)
    group = EngineGroup(members, ops=(STAMP,))
    replacing = asyncio.ensure_future(group.replace("stamp", STAMP_V2))
    await until(lambda: journal.of(0))  # engine 0 compiles v2
    replacing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await replacing
    again = await group.replace("stamp", STAMP_V2)
    assert again.version == 3 and set(again.per_engine) == {0, 1}
    assert await versions_run(group) == {0: 3, 1: 3}
    # The cancelled change went on to its end: v2 is on every engine, and the group knows.
    assert (await group.alias("stamp", 2)).version == 2
    assert await versions_run(group) == {0: 2, 1: 2}


async def test_a_group_ask_ends_at_its_timeout_for_every_message(
    system: ActorSystem, no_loop_errors: list[dict[str, Any]]
) -> None:
    """``group.ask(message, timeout=)`` had let the timeout of all but Enqueue and Drain
    go unused: the caller waited for the whole change instead of AskTimeout."""
    members, _ = await fake_group_members(system, (0, 1), (STAMP,), compile_s=SLOW_COMPILE_S)
    group = EngineGroup(members, ops=(STAMP,))
    loop = asyncio.get_running_loop()
    sent = loop.time()
    with pytest.raises(AskTimeout, match=r"did not answer ReplaceOp in 0\.05 s"):
        await group.ask(ReplaceOp(name="stamp", body=STAMP_V2), timeout=0.05)
    assert loop.time() - sent < SLOW_COMPILE_S
    with pytest.raises(InvalidArgument, match="ask timeout"):
        await group.ask(Stats(), timeout=-1.0)
    assert (await group.replace("stamp", STAMP_V2)).version == 3  # after the one timed out


class _LostWithItsInstall(FakeLocalMember):
    """An engine whose host is lost (EngineLost: it may or may not have run) with the
    answer to its first InstallOp in flight, after the engine had installed the op."""

    lost_once = False

    async def ask(self, message: Message, timeout: float | None = None) -> Any:
        reply = await super().ask(message, timeout)
        if isinstance(message, InstallOp) and not self.lost_once:
            self.lost_once = True
            raise EngineLost("the host was lost with this InstallOp in flight")
        return reply


async def test_an_install_lost_on_its_way_back_from_the_first_engine_keeps_its_number(
    system: ActorSystem,
) -> None:
    """EngineLost says the change may have been made: its number is taken, as after a
    failure in phase 2, so the next replace does not collide with what engine 0 holds."""
    journal = Journal([])
    first = await _LostWithItsInstall.start_fake(system, 0, journal, (STAMP,))
    second = await FakeLocalMember.start_fake(system, 1, journal, (STAMP,))
    group = EngineGroup([first, second], ops=(STAMP,))
    with pytest.raises(EngineLost):
        await group.replace("stamp", STAMP_V2)
    assert await versions_run(group) == {0: 1, 1: 1}
    again = await group.replace("stamp", STAMP_V2)
    assert again.version == 3 and await versions_run(group) == {0: 3, 1: 3}


# ----------------------------------------------------------------- batches
@pytest.mark.parametrize("devices", [[1, 0, 1], [1]])
async def test_a_batch_counted_by_its_devices_alone_reaches_each_engine_with_its_count(
    system: ActorSystem, devices: list[int]
) -> None:
    """The group counts a batch's tasks by its ``devices`` column too; a part sent with
    no per-task column and no count could not be counted by its engine (the engine's
    task_count refuses it: "EnqueueBatch needs per-task arrays or a count")."""
    members, _ = await fake_group_members(system, (0, 1))
    group = EngineGroup(members)
    outs = PerDevice({d: await group.upload(np.zeros(2, np.float32), device=d) for d in (0, 1)})
    batch = EnqueueBatch(op="fill", args=(outs, 7.0), n=1)
    reply = await group.enqueue_batch(batch, devices=np.array(devices))
    assert reply.count == len(devices) and reply.failed == 0
    assert {k: part.count for k, part in reply.per_engine.items()} == {
        d: devices.count(d) for d in set(devices)
    }
    for device in set(devices):
        np.testing.assert_array_equal(await group.download(outs.on(device, "out")), [7, 0])


def test_each_part_of_a_batch_counted_by_its_devices_passes_the_engines_count() -> None:
    """What the engine checks of each part it is sent (engine.args.task_count)."""
    fill = next(op for op in BUILTIN_OPS if op.name == "fill")
    outs = PerDevice({0: "out of engine 0", 1: "out of engine 1"})
    batch = EnqueueBatch(op="fill", args=(outs, 7.0), n=1)
    parts = split_batch(batch, fill, Locator((0, 1)), devices=np.array([1, 0, 1]), spread_over=())
    assert {part.key: task_count(part.message) for part in parts} == {0: 1, 1: 2}


# ---------------------------------------------------------- sharded arrays
class _Full(FakeLocalMember):
    """An engine whose device has no room for another upload."""

    async def upload(self, host: np.ndarray) -> Any:
        await asyncio.sleep(0)
        raise DeviceFault("out of memory")


class _Restarted(FakeLocalMember):
    """An engine that holds none of the arrays uploaded to it before (a Ray actor that
    Ray started anew): freeing one is GpuRefStale."""

    async def free(self, array: Any) -> None:
        raise GpuRefStale("remote array 1 of an earlier instance of this Ray actor", 0, 1)


async def test_a_scatter_that_fails_on_one_engine_leaves_no_shard_behind(
    system: ActorSystem,
) -> None:
    """The shards already uploaded are freed (the caller gets no ShardedArray to free
    them with), and the bytes placed on their engines no longer count."""
    journal = Journal([])
    members = [
        await FakeLocalMember.start_fake(system, 0, journal),
        await _Full.start_fake(system, 1, journal),
        await FakeLocalMember.start_fake(system, 2, journal),
    ]
    group = EngineGroup(members)  # (least_loaded: a tie goes to the first device)
    with pytest.raises(DeviceFault, match="out of memory"):
        await group.scatter(np.zeros(3000, np.uint8))
    assert group.pick() == 0  # no bytes count on device 0 or 2
    with pytest.raises(WrongDevice, match="device 9 has no engine"):
        await group.scatter(np.zeros(3000, np.uint8), devices=(0, 9))
    assert group.pick() == 0


async def test_freeing_a_sharded_array_frees_every_shard_where_one_fails(
    system: ActorSystem,
) -> None:
    """The other shards are freed all the same (they had been left on their engines),
    and PartialFailure says where the array was freed."""
    journal = Journal([])
    members = [
        await _Restarted.start_fake(system, 0, journal),
        await FakeLocalMember.start_fake(system, 1, journal),
    ]
    group = EngineGroup(members)
    sharded = await group.scatter(np.zeros(4000, np.uint8))
    with pytest.raises(PartialFailure) as caught:
        await group.free(sharded)
    assert list(caught.value.done) == [1] and isinstance(caught.value.errors[0], GpuRefStale)
    await group.upload(np.zeros(10, np.uint8), device=1)
    assert group.pick() == 0  # no shard counts: device 0's went with its old engine


async def test_an_array_an_engine_lost_in_a_restart_no_longer_counts_once_freed(
    system: ActorSystem,
) -> None:
    """Freeing it says GpuRefStale, and its bytes leave the placement's count: they had
    counted against that engine for good, steering host data away from it."""
    journal = Journal([])
    members = [
        await _Restarted.start_fake(system, 0, journal),
        await FakeLocalMember.start_fake(system, 1, journal),
    ]
    group = EngineGroup(members)
    stale = await group.upload(np.zeros(4000, np.uint8), device=0)
    await group.upload(np.zeros(10, np.uint8), device=1)
    assert group.pick() == 1
    with pytest.raises(GpuRefStale):
        await group.free(stale)
    assert group.pick() == 0


class _Exit(BaseException):
    """An exit, not an error (as KeyboardInterrupt is: asyncio would stop the loop for
    that one itself)."""


class _ExitsOnStop(FakeLocalMember):
    """An engine whose stop ends in an exit."""

    async def stop(self, *, force: bool = False) -> ShutdownReport:
        await super().stop(force=force)
        raise _Exit("stopping")


async def test_a_shutdown_raises_an_engines_exit_once_every_other_has_stopped(
    system: ActorSystem,
) -> None:
    """An exit (a BaseException, not an Exception) from one engine's stop is raised, as
    an ask of every engine raises it, not dropped; the other engine stopped first."""
    journal = Journal([])
    members = [
        await _ExitsOnStop.start_fake(system, 0, journal),
        await FakeLocalMember.start_fake(system, 1, journal),
    ]
    group = EngineGroup(members)
    with pytest.raises(_Exit, match="stopping"):
        await group.shutdown()
    await asyncio.wait_for(system.watch(members[1].ref), 5)  # (it stopped all the same)


# ------------------------------------------------------ a Ray member's link
async def test_batches_waiting_for_a_link_that_cannot_be_had_try_it_once(
    captured_logs: list[dict[str, Any]],
) -> None:
    """Batches that waited while the first gave the link up go through Ray at once: each
    had asked for the link again (two Ray calls and two connects each, one after another,
    up to LINK_CONNECT_SECONDS apiece where a firewall drops the packets) and warned."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'gpuactors[ray]')")
    from gpuactors.ray.host import Outcome
    from gpuactors.ray.member import RayMember
    from gpuactors.worker.link import LinkAddress, OpenLink

    with socket.socket() as closed:  # a port where nothing listens
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    asked: list[Message] = []

    async def call(message: Message, changes: int) -> Outcome:
        asked.append(message)
        if isinstance(message, OpenLink):
            return Outcome(value=LinkAddress("127.0.0.1", port, "token"))
        assert isinstance(message, EnqueueBatch)
        return Outcome(value=BatchCompletion(first_seq=1, count=message.count or 0, failed=0))

    member = RayMember(
        SimpleNamespace(call=SimpleNamespace(remote=call)), 0, idempotent=frozenset()
    )
    batch = EnqueueBatch(op="fill", args=(np.zeros(4, np.float32), 1.0), n=1, count=4)
    replies = await asyncio.gather(*(member.ask(batch) for _ in range(5)))
    assert [reply.count for reply in replies] == [4] * 5
    assert sum(isinstance(message, OpenLink) for message in asked) == 2  # (asked twice)
    assert [entry["event"] for entry in captured_logs] == [
        "a Ray actor's link cannot be had; its batches go through Ray calls"
    ]


# ---------------------------------------------------------------- Ray pool
async def start_slow_member(system: ActorSystem, spec: Any) -> FakeLocalMember:
    """A Ray actor's stand-in engine whose installs take ``SLOW_COMPILE_S``."""
    return await FakeLocalMember.start_fake(
        system, spec.device_id, Journal([]), spec.ops, compile_s=SLOW_COMPILE_S
    )


async def slow_pool(actors: int) -> EngineGroup:
    from gpuactors.ray import start_ray_pool

    ops: tuple[OpSpec, ...] = (STAMP,)
    return await start_ray_pool(
        actors=actors, ops=ops, num_gpus=0, max_restarts=2, start_member=start_slow_member
    )


async def stamp_version(pool: EngineGroup, actor: int) -> int:
    result = await pool.run("stamp", np.zeros(1, np.int32), n=1, device=actor)
    assert result.arrays[0][0] == result.completion.version
    return result.completion.version


async def instance(pool: EngineGroup, actor: int) -> str:
    """Which instance of Ray actor ``actor`` answers now (its RemoteArrays say)."""
    remote = await pool.upload(np.zeros(1, np.int32), device=actor)
    owner: str = remote.owner
    return owner


async def restarted(ray: Any, pool: EngineGroup, actor: int, seconds: float = 60.0) -> int:
    """Kill Ray actor ``actor`` (Ray starts it anew): the version the new instance runs."""
    before = await instance(pool, actor)
    ray.kill(pool.member(actor).actor, no_restart=False)  # type: ignore[attr-defined]
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            if await instance(pool, actor) != before:
                return await stamp_version(pool, actor)
        except EngineLost:
            pass
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.2)


@pytest.mark.slow
async def test_a_pool_replace_cancelled_mid_compile_leaves_the_pool_in_step(
    ray_cluster: Any,
) -> None:
    """As for an EngineGroup: the cancelled replace goes on, the next one takes v3, and
    an actor that Ray restarts is given both (it runs what the others run)."""
    pool = await slow_pool(actors=2)
    replacing = asyncio.ensure_future(pool.replace("stamp", STAMP_V2))
    await asyncio.sleep(SLOW_COMPILE_S / 2)  # actor 0 compiles v2
    replacing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await replacing
    assert (await pool.replace("stamp", STAMP_V2)).version == 3
    assert [await stamp_version(pool, actor) for actor in (0, 1)] == [3, 3]
    assert await restarted(ray_cluster, pool, 1) == 3
    assert (await pool.rollback("stamp")).version == 2  # the actors agree on the history
    await pool.shutdown()


@pytest.mark.slow
async def test_an_op_change_whose_ask_timed_out_is_replayed_to_a_restarted_actor(
    ray_cluster: Any,
) -> None:
    """A change the actor applied after its asker gave up (AskTimeout) is in the member's
    change log all the same: the instance Ray starts after a loss runs what the lost
    one ran."""
    pool = await slow_pool(actors=1)
    member = pool.member(0)
    v2 = STAMP.model_copy(update={"version": 2, "body": STAMP_V2})
    with pytest.raises(AskTimeout):
        await member.ask(InstallOp(op=v2, activate=True), timeout=SLOW_COMPILE_S / 5)
    await asyncio.sleep(SLOW_COMPILE_S * 2)  # the actor installs v2 meanwhile
    assert await stamp_version(pool, 0) == 2
    assert await restarted(ray_cluster, pool, 0) == 2
    await pool.shutdown()
