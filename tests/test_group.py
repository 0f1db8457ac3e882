"""EngineGroup's own logic on CPU stand-in engines (fake_engines.py).

Routing, batch splitting and joining, placement, the order in which op changes
reach the engines, and what one engine's fault does to the others. The engines
are fakes here; test_group_gpu.py runs the same things on two real GPUs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from fake_engines import BAD, STAMP, STAMP_V2, FakeDeviceArray, Journal, fake_group_members
from gpuactors.actors import ActorSystem
from gpuactors.cuda import cuda_device_count
from gpuactors.engine import EnqueueBatch, Stats
from gpuactors.errors import (
    CompileError,
    DeviceFault,
    EngineModeError,
    InvalidArgument,
    NoCudaDevice,
    PartialFailure,
    UnhandledMessage,
    UnknownOp,
    WrongDevice,
)
from gpuactors.group import EngineGroup, GroupStats, PerDevice, Shard, ShardedArray
from gpuactors.messages import Message
from gpuactors.worker import IsolationConfig, RemoteArray


@pytest.fixture
async def system() -> AsyncIterator[ActorSystem]:
    async with ActorSystem("group-test") as system:
        yield system


async def two_fakes(
    system: ActorSystem, devices: tuple[int, ...] = (0, 1), **kwargs: object
) -> tuple[EngineGroup, Journal]:
    members, journal = await fake_group_members(system, devices, (STAMP, BAD))
    return EngineGroup(members, ops=(STAMP, BAD), **kwargs), journal  # type: ignore[arg-type]


def kinds(journal: Journal, device: int) -> list[str]:
    return [kind for kind, _ in journal.of(device)]


# ------------------------------------------------------------------- routing
async def test_a_task_goes_to_the_device_that_holds_its_arrays(system: ActorSystem) -> None:
    group, journal = await two_fakes(system)
    for device in (0, 1):
        out = await group.upload(np.zeros(4, np.float32), device=device)
        assert out.device_id == device
        done = await group.enqueue("fill", out, float(device + 3), n=4)
        assert done.op == "fill"
        np.testing.assert_array_equal(await group.download(out), np.full(4, device + 3.0))
    assert kinds(journal, 0) == ["Enqueue"] and kinds(journal, 1) == ["Enqueue"]


async def test_arrays_on_two_devices_are_refused_before_any_engine_sees_them(
    system: ActorSystem,
) -> None:
    group, journal = await two_fakes(system)
    y = await group.upload(np.zeros(4, np.float32), device=0)
    x = await group.upload(np.ones(4, np.float32), device=1)
    with pytest.raises(WrongDevice, match="argument 1 lives on device 1 but argument 0"):
        await group.enqueue("axpy", y, x, 2.0, n=4)
    with pytest.raises(WrongDevice, match="the task was sent to device 1"):
        await group.enqueue("fill", y, 1.0, n=4, device=1)
    elsewhere = FakeDeviceArray(np.zeros(4, np.float32), 5)
    with pytest.raises(WrongDevice, match="device 5 has no engine"):
        await group.enqueue("fill", elsewhere, 1.0, n=4)
    assert journal.entries == []


async def test_host_data_is_placed_round_robin_or_on_the_least_loaded(
    system: ActorSystem,
) -> None:
    group, journal = await two_fakes(system, placement="round_robin")
    y, x = np.ones(8, np.float32), np.arange(8, dtype=np.float32)
    results = [await group.run("axpy", y, x, 2.0, n=8, returns=(0,)) for _ in range(4)]
    for result in results:
        np.testing.assert_allclose(result.arrays[0], 1.0 + 2.0 * x)
    assert kinds(journal, 0) == kinds(journal, 1) == ["Enqueue", "Enqueue"]

    least, _ = await two_fakes(system, devices=(2, 3))
    await least.upload(np.zeros(1000, np.uint8), device=2)  # device 2 holds more bytes now
    assert least.pick() == 3
    await least.upload(np.zeros(3000, np.uint8))  # placed on 3, the least loaded
    assert least.pick() == 2


async def test_a_sharded_array_cannot_be_one_task_argument(system: ActorSystem) -> None:
    group, _ = await two_fakes(system)
    sharded = await group.scatter(np.zeros((4, 2), np.float32))
    with pytest.raises(InvalidArgument, match="one task runs on one engine"):
        await group.enqueue("fill", sharded, 1.0, n=2)


async def test_a_scatter_over_one_device_twice_is_refused_before_any_upload(
    system: ActorSystem,
) -> None:
    group, _ = await two_fakes(system)
    uploads: list[np.ndarray] = []
    for member in group.members:
        upload = member.upload

        async def counted(host: np.ndarray, upload: Any = upload) -> Any:
            uploads.append(host)
            return await upload(host)

        member.upload = counted  # type: ignore[method-assign]
    with pytest.raises(InvalidArgument, match=r"one shard per engine, got devices \[0, 0\]"):
        await group.scatter(np.zeros(8, np.float32), devices=(0, 0))
    assert uploads == []  # (for an isolated engine, an upload nobody holds stays there)


async def test_remote_arrays_route_to_the_engine_that_issued_them() -> None:
    from gpuactors.group.routing import Locator

    locator = Locator((0, 1))
    remote = RemoteArray(id=1, shape=(4,), dtype="<f4", generation=1, owner="abc")
    with pytest.raises(InvalidArgument, match="outside this group"):
        locator.key_of(remote)
    locator.learn(remote, 1)
    assert locator.task_key((np.zeros(2), remote[1:3], 2.0)) == 1
    assert locator.task_key((np.zeros(2), 1.0)) is None


# ------------------------------------------------------------------- batches
async def scattered_rows(
    group: EngineGroup, rows: int
) -> tuple[np.ndarray, np.ndarray, ShardedArray, ShardedArray]:
    """axpy's ``y`` and ``x`` (``rows`` rows of 4 floats) on the host and scattered."""
    y_host = np.ones((rows, 4), np.float32)
    x_host = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    return y_host, x_host, await group.scatter(y_host), await group.scatter(x_host)


def axpy_rows(y: ShardedArray, x: ShardedArray, starts: np.ndarray) -> EnqueueBatch:
    """y += 2 x over the row of 4 floats at each task's start, a status per task."""
    return EnqueueBatch(
        op="axpy",
        args=(y, x, 2.0),
        n=4,
        offsets={"y": starts, "x": starts},
        per_task=True,
        after="none",
    )


async def test_a_batch_is_split_by_where_each_tasks_data_lives(system: ActorSystem) -> None:
    group, journal = await two_fakes(system)
    rows = 10
    y_host, x_host, y, x = await scattered_rows(group, rows)
    assert [(s.device, s.start, s.stop) for s in y.shards] == [(0, 0, 20), (1, 20, 40)]
    starts = np.arange(rows) * 4
    reply = await group.enqueue_batch(axpy_rows(y, x, starts))
    assert reply.count == rows and reply.failed == 0 and reply.statuses.shape == (rows,)
    assert {key: part.count for key, part in reply.per_engine.items()} == {0: 5, 1: 5}
    np.testing.assert_allclose(await group.download(y), y_host + 2.0 * x_host)
    assert [detail for kind, detail in journal.of(1) if kind == "EnqueueBatch"] == [5]


async def test_a_batch_whose_offsets_are_out_of_order_is_split_by_each_task(
    system: ActorSystem,
) -> None:
    group, _ = await two_fakes(system)
    rows = 10
    y_host, x_host, y, x = await scattered_rows(group, rows)
    in_order = np.arange(rows) * 4
    shuffled = np.array([9, 0, 5, 1, 8, 2, 7, 3, 6, 4]) * 4  # devices 1, 0, 1, 0, ...
    reply = await group.enqueue_batch(axpy_rows(y, x, shuffled))
    assert {key: part.count for key, part in reply.per_engine.items()} == {0: 5, 1: 5}
    assert reply.statuses.shape == (rows,) and reply.failed == 0
    np.testing.assert_allclose(await group.download(y), y_host + 2.0 * x_host)
    with pytest.raises(WrongDevice, match=r"task 0 belongs on device 1 .* and on device 0"):
        await group.enqueue_batch(  # y's device for each task against x's runs
            EnqueueBatch(op="axpy", args=(y, x, 1.0), n=4, offsets={"y": shuffled, "x": in_order})
        )


async def test_a_batch_with_a_task_across_two_devices_is_refused_whole(
    system: ActorSystem,
) -> None:
    group, journal = await two_fakes(system)
    y = await group.scatter(np.ones(8, np.float32))  # device 0: [0, 4), device 1: [4, 8)
    x = await group.scatter(np.ones(8, np.float32), devices=(1, 0))  # the other way round
    starts = np.arange(4) * 2
    with pytest.raises(
        WrongDevice,
        match=r"task 0 belongs on device 0 \(where argument 'y' has its data\) and on device 1",
    ):
        await group.enqueue_batch(
            EnqueueBatch(op="axpy", args=(y, x, 1.0), n=2, offsets={"y": starts, "x": starts})
        )
    with pytest.raises(InvalidArgument, match=r"task 1 needs elements \[3, 6\)"):
        await group.enqueue_batch(
            EnqueueBatch(op="fill", args=(y, 1.0), n=3, offsets={"out": np.array([0, 3])})
        )
    with pytest.raises(
        WrongDevice, match=r"task 0 belongs on device 1 \(the device given for it\) and on device 0"
    ):
        await group.enqueue_batch(
            EnqueueBatch(op="fill", args=(y, 1.0), n=1, offsets={"out": np.array([0])}),
            devices=1,
        )
    for offsets, task in ((np.array([-1, 0, 5]), 0), (np.array([5, -2, 0]), 1)):  # in order, not
        with pytest.raises(
            InvalidArgument, match=rf"task {task} starts at element -\d \(offsets must not be"
        ):
            await group.enqueue_batch(
                EnqueueBatch(op="fill", args=(y, 1.0), n=1, offsets={"out": offsets})
            )
    huge = np.array([0, 2**63], dtype=np.uint64)  # would be negative as int64
    with pytest.raises(
        InvalidArgument, match=r"offsets\['out'\] must be below 2\*\*62, got 9223372036854775808"
    ):
        await group.enqueue_batch(
            EnqueueBatch(op="fill", args=(y, 1.0), n=1, offsets={"out": huge})
        )
    # Beyond an engine's 2**62 elements: refused here, before an offset plus a length
    # could wrap around int64 while the tasks are located (and pass as held).
    for n, offsets, what in (
        (np.array([1, 2**63 - 3]), np.array([0, 5]), "n"),
        (2, np.array([0, 2**63 - 1]), r"offsets\['out'\]"),
        (2, range(0, 2**62 + 3, 2**61 + 1), r"offsets\['out'\]"),
    ):
        with pytest.raises(InvalidArgument, match=rf"{what} must be below 2\*\*62"):
            await group.enqueue_batch(
                EnqueueBatch(op="fill", args=(y, 1.0), n=n, offsets={"out": offsets})
            )
    # What one engine refuses, a group refuses alike.
    for n, offsets, message in (
        (1, np.array([], dtype=np.int64), r"needs 1 to 2,147,483,648 tasks, got 0"),
        (np.float64(4.0), np.array([0]), r"n must be a 1-D array, got shape \(\)"),
    ):
        with pytest.raises(InvalidArgument, match=message):
            await group.enqueue_batch(
                EnqueueBatch(op="fill", args=(y, 1.0), n=n, offsets={"out": offsets})
            )
    outs = PerDevice({d: await group.upload(np.zeros(4, np.float32), device=d) for d in (0, 1)})
    with pytest.raises(InvalidArgument, match=r"offsets\['out'\] must not be negative"):
        await group.enqueue_batch(
            EnqueueBatch(op="fill", args=(outs, 1.0), n=1, offsets={"out": np.array([0, -1])}),
            devices=np.array([0, 1]),
        )
    assert journal.entries == []


async def test_explicit_devices_per_task_with_an_array_per_device(system: ActorSystem) -> None:
    group, journal = await two_fakes(system)
    outs = {d: await group.upload(np.zeros(6, np.float32), device=d) for d in (0, 1)}
    devices = np.array([1, 0, 1, 0, 1, 1])
    local = np.array([0, 0, 1, 1, 2, 3])  # offsets into each device's own array
    values = np.arange(6, dtype=np.float32) + 1
    batch = EnqueueBatch(
        op="fill",
        args=(PerDevice(outs), 0.0),
        n=1,
        offsets={"out": local},
        scalars={"value": values},
        per_task=True,
    )
    reply = await group.enqueue_batch(batch, devices=devices)
    assert {key: part.count for key, part in reply.per_engine.items()} == {0: 2, 1: 4}
    np.testing.assert_array_equal(await group.download(outs[0]), [2, 4, 0, 0, 0, 0])
    np.testing.assert_array_equal(await group.download(outs[1]), [1, 3, 5, 6, 0, 0])
    assert kinds(journal, 0) == kinds(journal, 1) == ["EnqueueBatch"]


async def test_an_explicit_device_outside_the_group_is_refused(system: ActorSystem) -> None:
    group, journal = await two_fakes(system)
    outs = PerDevice({d: await group.upload(np.zeros(4, np.float32), device=d) for d in (0, 1)})
    batch = EnqueueBatch(op="fill", args=(outs, 1.0), n=1, count=4)
    with pytest.raises(WrongDevice, match="task 2 was sent to device 9"):
        await group.enqueue_batch(batch, devices=np.array([0, 1, 9, 1]))
    with pytest.raises(WrongDevice, match="the tasks were sent to device 3"):
        await group.enqueue_batch(batch, devices=3)
    with pytest.raises(InvalidArgument, match="devices must be a 1-D integer array"):
        await group.enqueue_batch(batch, devices=np.array([0.0, 1.0, 0.0, 1.0]))
    assert journal.entries == []


async def test_tasks_tied_to_no_device_are_spread_evenly(system: ActorSystem) -> None:
    group, _ = await two_fakes(system)
    outs = {d: await group.upload(np.zeros(5, np.float32), device=d) for d in (0, 1)}
    reply = await group.enqueue_batch(
        EnqueueBatch(op="fill", args=(PerDevice(outs), 7.0), n=1, count=10, per_task=True)
    )
    assert {key: part.count for key, part in reply.per_engine.items()} == {0: 5, 1: 5}
    assert reply.count == 10 and reply.failed == 0


async def test_a_batch_part_on_a_faulted_device_fails_only_its_tasks(system: ActorSystem) -> None:
    group, _ = await two_fakes(system)
    y = await group.scatter(np.zeros(8, np.float32))
    with pytest.raises(DeviceFault):
        await group.enqueue("bad_write", y.shard_on(1).array, n=1)
    batch = EnqueueBatch(op="fill", args=(y, 1.0), n=1, offsets={"out": np.arange(8)})
    with pytest.raises(PartialFailure) as caught:
        await group.enqueue_batch(batch)
    assert list(caught.value.done) == [0] and isinstance(caught.value.errors[1], DeviceFault)
    np.testing.assert_array_equal(caught.value.tasks[1], [4, 5, 6, 7])
    np.testing.assert_array_equal(await group.download(y.shard_on(0).array), np.ones(4))


# ---------------------------------------------------------------- live ops
async def test_a_replace_compiles_first_loads_everywhere_then_flips_every_name(
    system: ActorSystem,
) -> None:
    group, journal = await two_fakes(system)
    reply = await group.replace("stamp", STAMP_V2)
    assert reply.version == 2 and reply.active and set(reply.per_engine) == {0, 1}
    assert reply.live_on_all_at >= reply.installed_at
    changes = [(d, k, detail) for d, k, detail in journal.entries if k != "Enqueue"]
    assert changes[0] == (0, "InstallOp", ("stamp", 2, False))  # alone: the compile
    assert {c[:2] for c in changes[1:2]} == {(1, "InstallOp")}
    assert sorted(changes[2:]) == [(0, "AliasOp", ("stamp", 2)), (1, "AliasOp", ("stamp", 2))]
    for device in (0, 1):
        out = await group.upload(np.zeros(1, np.int32), device=device)
        assert (await group.enqueue("stamp", out, n=1)).version == 2
        assert (await group.download(out))[0] == 2


async def test_a_compile_error_leaves_every_engine_on_the_old_version(system: ActorSystem) -> None:
    group, journal = await two_fakes(system)
    with pytest.raises(CompileError):
        await group.replace("stamp", "syntax error;\nreturn 0;")
    assert kinds(journal, 0) == ["InstallOp"] and kinds(journal, 1) == []
    for device in (0, 1):
        out = await group.upload(np.zeros(1, np.int32), device=device)
        assert (await group.enqueue("stamp", out, n=1)).version == 1
    assert (await group.replace("stamp", STAMP_V2)).version == 2  # the number was not used up


async def test_an_install_refused_by_one_engine_leaves_every_name_on_the_old_version(
    system: ActorSystem,
) -> None:
    group, journal = await two_fakes(system)
    with pytest.raises(PartialFailure) as caught:
        await group.replace("stamp", STAMP_V2 + "\n// refused on device 1")
    assert list(caught.value.done) == [0] and isinstance(caught.value.errors[1], EngineModeError)
    assert "AliasOp" not in kinds(journal, 0) + kinds(journal, 1)
    for device in (0, 1):
        out = await group.upload(np.zeros(1, np.int32), device=device)
        assert (await group.enqueue("stamp", out, n=1)).version == 1
    # Engine 0 holds v2 now: the next replacement takes v3, which every engine accepts.
    again = await group.replace("stamp", STAMP_V2)
    assert again.version == 3 and set(again.per_engine) == {0, 1}
    for device in (0, 1):
        out = await group.upload(np.zeros(1, np.int32), device=device)
        assert (await group.enqueue("stamp", out, n=1)).version == 3


async def test_alias_and_rollback_reach_every_engine(system: ActorSystem) -> None:
    group, journal = await two_fakes(system)
    await group.replace("stamp", STAMP_V2)
    back = await group.rollback("stamp")
    assert (back.version, back.previous) == (1, 2) and set(back.per_engine) == {0, 1}
    again = await group.alias("stamp", 2)
    assert (again.version, again.previous) == (2, 1)
    before = len(journal.entries)
    with pytest.raises(InvalidArgument, match="no version 7"):
        await group.alias("stamp", 7)
    with pytest.raises(UnknownOp):
        await group.alias("nope", 1)
    assert len(journal.entries) == before  # refused before any engine saw it
    out = await group.upload(np.zeros(1, np.int32), device=1)
    assert (await group.enqueue("stamp", out, n=1)).version == 2


async def test_the_rule_while_a_switch_rolls_under_load(system: ActorSystem) -> None:
    """Each client sends stamp tasks one after another to one device: on each device the
    versions never go back, and every task sent after the reply runs the new one."""
    members, journal = await fake_group_members(system, (0, 1), (STAMP,), compile_s=0.05)
    group = EngineGroup(members, ops=(STAMP,))
    outs = {d: await group.upload(np.zeros(1, np.int32), device=d) for d in (0, 1)}
    seen: dict[int, list[tuple[float, int]]] = {0: [], 1: []}
    stop = asyncio.Event()

    async def client(device: int) -> None:
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            sent = loop.time()
            done = await group.enqueue("stamp", outs[device], n=1)
            seen[device].append((sent, done.version))
            await asyncio.sleep(0)

    clients = [asyncio.ensure_future(client(d)) for d in (0, 1, 0, 1)]
    await asyncio.sleep(0.02)
    reply = await group.replace("stamp", STAMP_V2)
    replied = asyncio.get_running_loop().time()
    await asyncio.sleep(0.02)
    stop.set()
    await asyncio.gather(*clients)
    for device in (0, 1):
        versions = [version for _, version in seen[device]]
        assert versions == sorted(versions) and versions[0] == 1 and versions[-1] == 2
        assert all(v == 2 for sent, v in seen[device] if sent >= replied)
    assert reply.switch_ms >= 0 and len(journal.entries) > 20


# ------------------------------------------------------------------ faults
async def test_one_device_faults_and_the_other_keeps_serving(system: ActorSystem) -> None:
    group, journal = await two_fakes(system, devices=(6, 7))
    outs = {d: await group.upload(np.zeros(4, np.float32), device=d) for d in (6, 7)}
    with pytest.raises(DeviceFault, match="bad_write"):
        await group.enqueue("bad_write", outs[7], n=4)
    assert group.serving() == (6,)
    with pytest.raises(DeviceFault):
        await group.enqueue("fill", outs[7], 1.0, n=4)
    await group.enqueue("fill", outs[6], 2.0, n=4)
    result = await group.run("fill", np.zeros(4, np.float32), 3.0, n=4)  # placed on 6
    np.testing.assert_array_equal(result.arrays[0], np.full(4, 3.0))
    await group.replace("stamp", STAMP_V2)  # reaches the serving engine only
    assert "InstallOp" in kinds(journal, 6) and "InstallOp" not in kinds(journal, 7)
    stats = await group.ask(Stats())
    assert isinstance(stats, GroupStats)
    assert stats.processed == sum(s.processed for s in stats.per_engine.values()) == 2
    assert stats.per_engine[7].generation > stats.per_engine[6].generation


async def test_stats_drain_and_shutdown_cover_every_engine(system: ActorSystem) -> None:
    group, _ = await two_fakes(system)
    for device in (0, 1):
        out = await group.upload(np.zeros(2, np.float32), device=device)
        for _ in range(device + 1):
            await group.enqueue("fill", out, 1.0, n=2)
    stats = await group.stats()
    assert {k: s.processed for k, s in stats.per_engine.items()} == {0: 1, 1: 2}
    assert stats.processed == 3 and stats.unavailable == {}
    assert set(await group.drain()) == {0, 1}
    reports = await group.shutdown()
    assert {k: r.completed for k, r in reports.items()} == {0: 1, 1: 2}
    assert group.serving() == ()


# ------------------------------------------------------------- bad input
async def test_bad_groups_and_messages_are_typed_errors(system: ActorSystem) -> None:
    members, _ = await fake_group_members(system, (0, 0))
    with pytest.raises(InvalidArgument, match="distinct keys"):
        EngineGroup(members)
    group, _ = await two_fakes(system, devices=(3, 4))
    with pytest.raises(InvalidArgument, match="placement"):
        EngineGroup(group.members, placement="random")  # type: ignore[arg-type]

    class Unknown(Message):
        pass

    with pytest.raises(UnhandledMessage):
        await group.ask(Unknown())
    with pytest.raises(UnknownOp):
        await group.enqueue_batch(EnqueueBatch(op="nope", count=2))
    with pytest.raises(InvalidArgument, match="shards must cover"):
        ShardedArray((Shard(0, 1, 4, None),), "<f4", (4,))
    if cuda_device_count() == 0:
        with pytest.raises(NoCudaDevice):
            await EngineGroup.start(system)
    with pytest.raises(InvalidArgument, match="each device once"):
        await EngineGroup.start(system, devices=(0, 0))


# ------------------------------------------------- isolated engines (CPU worker)
@pytest.mark.slow
@pytest.mark.usefixtures("cpu_worker_importable")
async def test_isolated_members_route_by_remote_array() -> None:
    """Two real IsolatedEngines (workers: the CPU stand-in of test_worker_supervision.py)."""
    isolation = IsolationConfig(worker_module="cpu_worker", start_timeout_s=30.0, standbys=0)
    async with ActorSystem("group-isolated") as system:
        group = await EngineGroup.start(system, devices=(0, 1), isolation=isolation)
        x = await group.upload(np.arange(4, dtype=np.float32), device=1)
        assert isinstance(x, RemoteArray)
        for _ in range(3):
            result = await group.run("axpy", np.ones(4, np.float32), x, 2.0, n=4, returns=(0,))
            np.testing.assert_allclose(result.arrays[0], 1.0 + 2.0 * np.arange(4))
        stats = await group.stats()
        assert {k: s.processed for k, s in stats.per_engine.items()} == {0: 0, 1: 3}
        with pytest.raises(InvalidArgument, match="send it a Job"):
            await group.enqueue("fill", 1.0, n=1, device=0)
        await group.shutdown()
