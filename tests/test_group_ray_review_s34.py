"""Fixes from a review of EngineGroup and the Ray pool, on CPU stand-in engines.

* A ShardedArray built by hand whose shard names an engine outside the group, or holds
  another engine's array, is refused (WrongDevice) by ``download`` and ``free`` before
  any engine is asked: it had raised KeyError, or freed the other shards first.
* A group start cancelled part-way stops the engines it had started.
* A device given by the caller is a whole number by the library's rule: ``device=True``
  had been taken as device 1, and NumPy integers had been refused by ``start``.
* ``install`` reads its op and ``activate`` as the InstallOp it sends: a string for
  the op had raised AttributeError, and ``activate=np.False_`` (which the message reads
  as False) had pointed every engine at the version all the same.
* ``zeros`` of a shape or dtype NumPy cannot make is InvalidArgument.
* ``start_ray_pool`` refuses an unknown placement before any actor starts.
* A Ray actor whose isolated engine failed for good (DeviceFailed) leaves the pool's
  service: placement had gone on sending it host data, every such job failing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import pytest

from fake_engines import (
    STAMP,
    STAMP_V2,
    FakeDeviceArray,
    FakeLocalMember,
    Journal,
    fake_group_members,
)
from gpuactors.actors import ActorSystem
from gpuactors.engine import ShutdownReport
from gpuactors.errors import DeviceFailed, InvalidArgument, WrongDevice
from gpuactors.group import EngineGroup, Shard, ShardedArray
from gpuactors.worker import JobResult


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("group-ray-review") as system:
        yield system


# ------------------------------------------------------------ sharded arrays
async def test_a_hand_built_sharded_array_naming_a_wrong_engine_is_refused_before_any_engine(
    system: ActorSystem,
) -> None:
    """Download had raised KeyError for a shard on an engine outside the group; free had
    freed the other shards (their bytes left the placement's count) and then raised a
    PartialFailure wrapping KeyError."""
    members, _ = await fake_group_members(system, (0, 1), (STAMP,))
    group = EngineGroup(members, ops=(STAMP,))
    held = await group.upload(np.zeros(1000, np.uint8), device=0)
    await group.upload(np.zeros(10, np.uint8), device=1)
    assert group.pick() == 1  # device 0 holds more bytes
    outside = FakeDeviceArray(np.zeros(10, np.uint8), 5)
    beyond = ShardedArray((Shard(0, 0, 1000, held), Shard(5, 1000, 1010, outside)), "|u1", (1010,))
    with pytest.raises(WrongDevice, match="device 5 has no engine in this group"):
        await group.download(beyond)
    with pytest.raises(WrongDevice, match="device 5 has no engine in this group"):
        await group.free(beyond)
    elsewhere = FakeDeviceArray(np.zeros(10, np.uint8), 0)
    crossed = ShardedArray(
        (Shard(0, 0, 1000, held), Shard(1, 1000, 1010, elsewhere)), "|u1", (1010,)
    )
    crossing = "shard of the array for device 1 holds an array that lives on device 0"
    with pytest.raises(WrongDevice, match=crossing):
        await group.download(crossed)
    with pytest.raises(WrongDevice, match=crossing):
        await group.free(crossed)
    assert group.pick() == 1  # nothing was freed: device 0's 1000 bytes still count


async def test_zeros_of_a_shape_or_dtype_numpy_cannot_make_is_invalid_argument(
    system: ActorSystem,
) -> None:
    members, _ = await fake_group_members(system, (0, 1), (STAMP,))
    group = EngineGroup(members, ops=(STAMP,))
    with pytest.raises(InvalidArgument, match="not understood"):
        await group.zeros(4, "no such dtype")
    with pytest.raises(InvalidArgument, match="negative dimensions"):
        await group.zeros((-1, 4), np.float32)
    assert (await group.zeros((4, 2), np.float32)).shape == (4, 2)


# ----------------------------------------------------------------- devices
class _Starts:
    """``LocalMember`` for ``EngineGroup.start``: fake engines, and a device that hangs."""

    journal = Journal([])
    hanging = 1

    @classmethod
    async def start(cls, system: ActorSystem, *, device_id: int, **_: Any) -> FakeLocalMember:
        if device_id == cls.hanging:
            await asyncio.Event().wait()  # (never set)
        return await FakeLocalMember.start_fake(system, device_id, cls.journal, (STAMP,))


async def test_a_device_given_by_the_caller_is_a_whole_number_never_a_bool(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    members, _ = await fake_group_members(system, (0, 1), (STAMP,))
    group = EngineGroup(members, ops=(STAMP,))
    host = np.zeros(4, np.float32)
    with pytest.raises(InvalidArgument, match="named by its number"):
        await group.upload(host, device=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="named by its number"):
        await group.run("fill", host, 1.0, n=4, device=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="named by its number"):
        await group.enqueue("fill", 1.0, n=4, device="1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="named by its number"):
        await group.scatter(host, devices=(True, 0))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="named by its number"):
        group.member(True)  # type: ignore[arg-type]
    assert (await group.upload(host, device=np.int64(1))).device_id == 1  # type: ignore[arg-type]
    result = await group.run("fill", host, 3.0, n=4, device=np.int64(1), returns=(0,))  # type: ignore[arg-type]
    np.testing.assert_array_equal(result.arrays[0], np.full(4, 3.0))

    monkeypatch.setattr(_Starts, "hanging", -1)
    monkeypatch.setattr("gpuactors.group.group.LocalMember", _Starts)
    started = await EngineGroup.start(system, devices=np.arange(2), ops=(STAMP,))
    assert started.devices == (0, 1)
    await started.shutdown()
    for devices in ((0, True), (0, -1), 2):
        with pytest.raises(InvalidArgument, match="devices must be device ordinals"):
            await EngineGroup.start(system, devices=devices, ops=(STAMP,))  # type: ignore[arg-type]


# ----------------------------------------------------------------- op changes
async def test_an_install_reads_its_op_and_activate_as_the_message_it_sends(
    system: ActorSystem,
) -> None:
    members, journal = await fake_group_members(system, (0, 1), (STAMP,))
    group = EngineGroup(members, ops=(STAMP,))
    with pytest.raises(InvalidArgument, match="invalid InstallOp"):
        await group.install("stamp")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="invalid InstallOp"):
        await group.install(STAMP.model_copy(update={"version": 2}), activate=None)  # type: ignore[arg-type]
    v2 = STAMP.model_copy(update={"version": 2, "body": STAMP_V2})
    with pytest.raises(InvalidArgument, match="activate must be True or False"):
        await group.install(v2, activate="no")  # type: ignore[arg-type]
    reply = await group.install(v2, activate=np.False_)  # type: ignore[arg-type]
    assert not reply.active
    assert [kind for _, kind, _ in journal.entries] == ["InstallOp", "InstallOp"]  # no AliasOp
    for device in (0, 1):
        out = await group.upload(np.zeros(1, np.int32), device=device)
        assert (await group.enqueue("stamp", out, n=1)).version == 1  # still v1 everywhere
    assert (await group.alias("stamp", 2)).version == 2  # (installed: the group knows it)


# ------------------------------------------------------------------ starting
async def test_a_group_start_cancelled_part_way_stops_the_engines_it_had_started(
    system: ActorSystem, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Device 0's engine started, device 2's too, device 1's was still starting when the
    caller gave up: the two started had been left running, with no one to stop them."""
    journal = Journal([])
    stopped: list[int] = []
    hanging = asyncio.Event()

    class Recorded(FakeLocalMember):
        async def stop(self, *, force: bool = False) -> ShutdownReport:
            stopped.append(self.device_id)
            return await super().stop(force=force)

    class Starts:
        @staticmethod
        async def start(system: ActorSystem, *, device_id: int, **_: Any) -> FakeLocalMember:
            if device_id == 1:
                await hanging.wait()  # (never set)
            return await Recorded.start_fake(system, device_id, journal, (STAMP,))

    monkeypatch.setattr("gpuactors.group.group.LocalMember", Starts)
    starting = asyncio.ensure_future(EngineGroup.start(system, devices=(0, 1, 2), ops=(STAMP,)))
    for _ in range(100):
        await asyncio.sleep(0.01)
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert sorted(stopped) == [0, 2]


# ----------------------------------------------------------------------- Ray
@pytest.mark.slow
async def test_a_pool_with_an_unknown_placement_is_refused_before_any_actor_starts(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group refused the placement only once every actor had started (compiled its
    ops on its GPU), and the actors were then left running, held by no one."""
    from fake_engines import start_fake_ray_member
    from gpuactors.ray import RayMember, start_ray_pool

    made: list[RayMember] = []

    class Recorded(RayMember):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr("gpuactors.ray.pool.RayMember", Recorded)
    with pytest.raises(InvalidArgument, match="placement must be one of"):
        await start_ray_pool(
            actors=1,
            ops=(STAMP,),
            num_gpus=0,
            start_member=start_fake_ray_member,
            placement="busiest",  # type: ignore[arg-type]
        )
    assert made == []


class _FailsForGood(FakeLocalMember):
    """An isolated engine in a Ray actor (as the actor sees it) whose worker spends its
    restart budget on ``bad_write``: every request after that is DeviceFailed."""

    isolated = True
    failed = False

    @property
    def serving(self) -> bool:
        return not self.failed

    async def run(self, op: str, args: Sequence[Any], **kwargs: Any) -> JobResult:
        if self.failed or op == "bad_write":
            self.failed = True
            raise DeviceFailed("the isolated engine failed: its restart budget is spent")
        return await super().run(op, args, **kwargs)


async def start_failing_member(system: ActorSystem, spec: Any) -> FakeLocalMember:
    """``HostSpec.start_member`` for the pool below (Ray's workers import this module)."""
    return await _FailsForGood.start_fake(system, spec.device_id, Journal([]), spec.ops)


@pytest.mark.slow
async def test_an_actor_whose_isolated_engine_failed_for_good_leaves_the_pools_service(
    ray_cluster: Any,
) -> None:
    from gpuactors.ray import start_ray_pool

    pool = await start_ray_pool(
        actors=2,
        ops=(STAMP,),
        num_gpus=0,
        start_member=start_failing_member,
        placement="round_robin",
    )
    with pytest.raises(DeviceFailed):
        await pool.run("bad_write", np.zeros(4, np.float32), n=4, device=1)
    assert pool.serving() == (0,)
    for _ in range(4):  # host data only: placed on the actors that serve
        result = await pool.run("fill", np.zeros(4, np.float32), 2.0, n=4, returns=(0,))
        np.testing.assert_array_equal(result.arrays[0], np.full(4, 2.0))
    await pool.shutdown()
